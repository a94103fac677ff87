//! The kit's conformance tests on the dflash draft (over the qwen4_exp
//! built-in target).

family_kit::conformance_tests!(dflash::DflashFamily);
