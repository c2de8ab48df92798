//! The integration tests of the tests crate, one module per concern, in one binary so the
//! workspace is linked once: `cargo test -p gitstate-tests --test it` runs them all,
//! `cargo test -p gitstate-tests --test it protocol::` one module.

mod access;
mod batch;
mod concurrency;
mod console;
mod contract;
mod copies;
mod credentials;
mod deploy;
mod encryption;
mod faults;
mod floor;
mod fold;
mod fuzz_corpus;
mod hand_edits;
mod history;
mod hostile;
mod hosts;
mod key_sources;
mod kms_keys;
mod lambda_events;
mod lambda_watch;
mod misconfigured;
mod model;
mod protocol;
mod races;
mod session;
mod sops_oracle;
mod state_refs;
mod terraform;
mod wrong_branch;
