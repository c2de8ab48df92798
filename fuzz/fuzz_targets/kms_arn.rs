#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gitstate_fuzz::kms_arn(data));
