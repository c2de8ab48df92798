#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gitstate_fuzz::sops_file(data));
