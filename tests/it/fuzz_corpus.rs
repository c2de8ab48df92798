//! The fuzz targets' corpora (fuzz/corpus/<target>/, seeds plus what libFuzzer found worth
//! keeping), replayed through the same checks in every `cargo test`, so a regression on an input
//! the fuzzer once reached fails the ordinary suite. The timed libFuzzer runs are `fuzz/run`.

#[path = "../../fuzz/src/checks.rs"]
mod checks;

use std::path::PathBuf;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "{} fails its check", path.display());
        count += 1;
    }
    assert!(count > 0, "{target}: empty corpus");
    eprintln!("{target}: {count} corpus inputs replayed");
}

#[test]
fn state_name_corpus() {
    replay("state_name", checks::state_name);
}

#[test]
fn basic_header_corpus() {
    replay("basic_header", checks::basic_header);
}

#[test]
fn pkt_line_corpus() {
    replay("pkt_line", checks::pkt_line);
}

#[test]
fn sops_file_corpus() {
    replay("sops_file", checks::sops_file);
}

#[test]
fn ref_name_corpus() {
    replay("ref_name", checks::ref_name);
}

#[test]
fn kms_arn_corpus() {
    replay("kms_arn", checks::kms_arn);
}
