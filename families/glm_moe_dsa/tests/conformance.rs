//! The kit's conformance tests on the glm_moe_dsa built-in fixture.

family_kit::conformance_tests!(glm_moe_dsa::GlmMoeDsaFamily);
