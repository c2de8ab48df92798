//! gitstate's domain: names, locks, the service rules, the ports to storage. It knows nothing
//! of HTTP frameworks, git libraries, AWS or how settings are read.

pub mod access;
pub mod api;
pub mod auth;
pub mod changes;
pub mod fold;
pub mod index;
mod lock;
mod name;
pub mod password;
pub mod ports;
pub mod protocol;
pub mod read_context;
pub mod refs;
pub mod report;
pub mod secret;
pub mod service;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod trailers;
pub mod wording;

pub use lock::{LockInfo, LockInfoError, UnlockRequest};
pub use name::{BranchName, MAX_NAME_BYTES, NameError, SEED_BRANCH, StateName};
pub use read_context::ReadContext;

#[cfg(test)]
mod tests {
    /// ARCHITECTURE.md's first invariant, kept by the manifest: the core depends on no git, HTTP
    /// or AWS crate, so no such import compiles here.
    #[test]
    fn the_core_depends_on_no_git_http_or_aws_crate() {
        let manifest: toml::Table = toml::from_str(include_str!("../Cargo.toml")).expect("toml");
        let dependencies = manifest
            .get("dependencies")
            .and_then(toml::Value::as_table)
            .expect("[dependencies]");
        assert!(dependencies.len() > 5, "{dependencies:?}");
        let forbidden = [
            "gix", "git2", "reqwest", "hyper", "axum", "http", "tower", "aws-", "lambda",
        ];
        for name in dependencies.keys() {
            assert!(
                !forbidden.iter().any(|f| name.starts_with(f)),
                "gitstate-core depends on {name}: the core knows no git, HTTP or AWS crate"
            );
        }
    }
}
