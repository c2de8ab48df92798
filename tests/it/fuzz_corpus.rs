//! The fuzz targets' corpora (fuzz/corpus/<target>/, seeds plus what libFuzzer found worth
//! keeping), replayed through the same checks in every `cargo test`, so a regression on an input
//! the fuzzer once reached fails the ordinary suite; then a bounded mutation run around them
//! (seeded: bit flips, inserted and deleted ranges, splices, tokens the parsers care about),
//! CI's short version of fuzzing. The coverage-guided libFuzzer runs are `fuzz/run`, by hand.

#[path = "../../fuzz/src/checks.rs"]
mod checks;

use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

fn replay(target: &str, check: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut corpus = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "{} fails its check", path.display());
        corpus.push(data);
    }
    assert!(!corpus.is_empty(), "{target}: empty corpus");
    eprintln!("{target}: {} corpus inputs replayed", corpus.len());
    mutate(target, check, &corpus);
}

/// Pieces the parsers split on or look for, inserted whole.
const TOKENS: [&[u8]; 16] = [
    b"..",
    b"/",
    b".lock",
    b"\0",
    b"refs/heads/",
    b"0000",
    b"ffff",
    b"\"",
    b"ENC[",
    b"sops",
    b"arn:aws:kms:",
    b"@{",
    b"\\",
    b" ",
    b"\n",
    b"\xc3\x28",
];

/// `GITSTATE_FUZZ_MUTATIONS` inputs (50,000 by default, about a second a target) made from the
/// corpus by one to four mutations each, through the target's check; a failure names the seed
/// and the input.
fn mutate(target: &str, check: fn(&[u8]), corpus: &[Vec<u8>]) {
    let count: usize = std::env::var("GITSTATE_FUZZ_MUTATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50_000);
    let seed = crate::misconfigured::seed(&format!("fuzz-{target}"));
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..count {
        let mut data = corpus[rng.random_range(0..corpus.len())].clone();
        for _ in 0..rng.random_range(1..=4) {
            mutation(&mut rng, &mut data, corpus);
        }
        data.truncate(4096);
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(
            outcome.is_ok(),
            "{target}: mutated input {round} (GITSTATE_TEST_SEED={seed}) fails its check: {:?}",
            String::from_utf8_lossy(&data)
        );
    }
    eprintln!("{target}: {count} mutated inputs checked");
}

fn mutation(rng: &mut StdRng, data: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    let at = |rng: &mut StdRng, len: usize| rng.random_range(0..=len);
    match rng.random_range(0..6) {
        0 if !data.is_empty() => {
            let i = rng.random_range(0..data.len());
            data[i] ^= 1 << rng.random_range(0..8);
        }
        1 => {
            let i = at(rng, data.len());
            let bytes: Vec<u8> = (0..rng.random_range(1..=8)).map(|_| rng.random()).collect();
            data.splice(i..i, bytes);
        }
        2 if !data.is_empty() => {
            let from = rng.random_range(0..data.len());
            let to = rng.random_range(from..=data.len().min(from + 16));
            data.drain(from..to);
        }
        3 if !data.is_empty() => {
            let from = rng.random_range(0..data.len());
            let to = rng.random_range(from..=data.len().min(from + 32));
            let piece = data[from..to].to_vec();
            let i = at(rng, data.len());
            data.splice(i..i, piece);
        }
        4 => {
            let other = &corpus[rng.random_range(0..corpus.len())];
            let keep = at(rng, data.len());
            let from = at(rng, other.len());
            data.truncate(keep);
            data.extend_from_slice(&other[from..]);
        }
        _ => {
            let token = TOKENS[rng.random_range(0..TOKENS.len())];
            let i = at(rng, data.len());
            data.splice(i..i, token.iter().copied());
        }
    }
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
