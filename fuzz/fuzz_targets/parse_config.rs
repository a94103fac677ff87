//! Fuzz target: arbitrary text into the JSON config parser
//! (`seam::policy::PolicyConfig::parse`) and the knobs resolved from what
//! it accepts. It must never panic; an accepted config names only known
//! knobs, and every error names the config file.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use seam::policy::{KNOBS, PolicyConfig};
use seam::ring::{RING_KNOBS, RingPolicy};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("fuzz-config.json");
    let knobs = [KNOBS, RING_KNOBS].concat();
    match PolicyConfig::parse(file, text, &knobs) {
        Ok(config) => {
            // No environment: every value comes from the config or a default.
            match RingPolicy::resolve(&|_| None, Some(&config), 16, Default::default()) {
                Ok(policy) => {
                    assert!((1..=64).contains(&policy.buffers.value));
                    assert!((1..=64).contains(&policy.readers.value));
                    assert!((1..=64).contains(&policy.lanes.value));
                    assert!(policy.mib.value <= 4096);
                }
                Err(e) => assert!(e.to_string().contains("fuzz-config.json"), "{e}"),
            }
        }
        Err(e) => assert!(e.to_string().contains("fuzz-config.json"), "{e}"),
    }
});
