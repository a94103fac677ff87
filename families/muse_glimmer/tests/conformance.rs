//! The kit's conformance tests on muse-glimmer's built-in fixture.

family_kit::conformance_tests!(muse_glimmer::MuseGlimmerFamily);
