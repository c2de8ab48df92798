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

/// Besides the replay: the seeds keep covering every key source the decoder reads, OpenPGP
/// entries alone, and key groups mixing OpenPGP with age and KMS (files sops 3.11 wrote).
#[test]
fn sops_file_corpus() {
    replay("sops_file", checks::sops_file);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/sops_file");
    let (mut pgp, mut mixed_groups, mut mixed_group) = (0, 0, 0);
    for entry in std::fs::read_dir(&dir).expect("corpus") {
        let data = std::fs::read(entry.expect("entry").path()).expect("corpus file");
        let Ok(document) = gitstate_sops::Document::parse(&data) else {
            continue;
        };
        let lists = |g: &gitstate_sops::KeyGroup| {
            let mut lists: Vec<&str> = g.entries.iter().map(|e| e.list).collect();
            if !g.kms.is_empty() {
                lists.push("kms");
            }
            lists.sort_unstable();
            lists.dedup();
            lists
        };
        let all: Vec<Vec<&str>> = document.groups.iter().map(lists).collect();
        if all.iter().flatten().any(|l| *l == "pgp") {
            pgp += 1;
            if document.groups.len() > 1 && all.iter().any(|l| !l.contains(&"pgp")) {
                mixed_groups += 1;
            }
            if all.iter().any(|l| l.len() > 1) {
                mixed_group += 1;
            }
        }
    }
    eprintln!(
        "sops_file: {pgp} with OpenPGP entries, {mixed_groups} with OpenPGP and other groups, {mixed_group} with a mixed group"
    );
    assert!(
        pgp >= 5 && mixed_groups >= 3 && mixed_group >= 1,
        "{pgp} {mixed_groups} {mixed_group}"
    );
}

#[test]
fn ref_name_corpus() {
    replay("ref_name", checks::ref_name);
}

#[test]
fn kms_arn_corpus() {
    replay("kms_arn", checks::kms_arn);
}
