//! The CLI's integration tests, one module per concern, in one binary: each runs the built
//! `gitstate` binary (`CARGO_BIN_EXE_gitstate`) as processes against the harness of
//! `gitstate-tests`. `cargo test -p gitstate-cli --test it serve::` runs one module.

/// The `gitstate` binary under test, as cargo built it for this package.
const GITSTATE: &str = env!("CARGO_BIN_EXE_gitstate");

mod attack;
mod branches;
mod breakglass;
mod doctor;
mod hosts;
mod many_writers;
mod processes;
mod release;
mod remote;
mod run;
mod seed;
mod serve;
mod settings;
mod shapes;
mod ssh;
mod startup;
mod state_ref_attacks;
mod store;
mod tls;
mod users;
mod which_state;
