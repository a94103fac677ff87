//! The kit's conformance tests on qwen4exp.

family_kit::conformance_tests!(qwen4_exp::Qwen4ExpFamily);
