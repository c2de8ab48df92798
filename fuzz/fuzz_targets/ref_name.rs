#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gitstate_fuzz::ref_name(data));
