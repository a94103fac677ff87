//! The kit's conformance tests on the glm5_next built-in fixture.

family_kit::conformance_tests!(glm5_next::Glm5NextFamily);
