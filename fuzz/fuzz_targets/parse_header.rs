//! Fuzz target: arbitrary bytes into the GGUF header parser. It must never
//! panic, and every tensor it accepts must lie inside the data it was given.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = seam::gguf::parse_header(data, Path::new("fuzz.gguf"), 0) else {
        return;
    };
    let len = data.len() as u64;
    assert!(header.alignment.is_power_of_two());
    assert!(header.data_offset.is_multiple_of(header.alignment));
    for t in &header.tensors {
        let end = t
            .offset
            .checked_add(t.n_bytes)
            .expect("tensor end overflows");
        assert!(
            end <= len,
            "tensor {:?} [{}, {end}) past {len}",
            t.name,
            t.offset
        );
        assert!(
            t.offset >= header.data_offset,
            "tensor {:?} before the data section",
            t.name
        );
        assert!(t.dims.len() <= 4);
        // The bytes are addressable: slicing must not panic.
        let _ = &data[t.offset as usize..end as usize];
    }
});
