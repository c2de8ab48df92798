//! Logs on standard error: text (colour only at a terminal, and not under NO_COLOR) or one JSON
//! object a line (`GITSTATE_LOG_FORMAT=json`); `RUST_LOG` sets the level.

use anyhow::bail;

use crate::Command;

/// Caps the AWS SDK and HTTP crates at INFO whatever `RUST_LOG` says: their TRACE output holds
/// whole requests, and a KMS `Encrypt` request carries a plaintext data key.
fn pinned_log_targets() -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::LevelFilter;
    tracing_subscriber::filter::Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_targets(
            gitstate_kms::SECRET_BEARING_LOG_TARGETS.map(|target| (target, LevelFilter::INFO)),
        )
}

pub fn init(command: &Command) -> anyhow::Result<()> {
    let settings: Option<&crate::settings::SettingsArgs> = match command {
        Command::Serve { settings, .. } => Some(settings),
        Command::Run { settings, .. } => Some(settings),
        Command::Rekey { settings, .. } => Some(settings),
        Command::Decrypt { settings, .. } => Some(settings),
        Command::Encrypt { settings, .. } => Some(settings),
        _ => None,
    };
    let settings = settings.and_then(|s| s.layered().ok());
    let format = settings.and_then(|s| s.get("GITSTATE_LOG_FORMAT"));
    // Under `run` the program's output is what matters: the backend only reports problems.
    let default_level = match command {
        Command::Run { .. } => "warn",
        _ => "info",
    };
    init_with(format, default_level)
}

/// Logging in `format` (`text`, `json`; unset: text) at `default_level` unless `RUST_LOG` says.
pub fn init_with(format: Option<String>, default_level: &str) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format.as_deref().map(str::trim) {
        None | Some("text") => builder
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .finish()
            .with(pinned_log_targets())
            .init(),
        Some("json") => builder
            .json()
            .with_ansi(false)
            .finish()
            .with(pinned_log_targets())
            .init(),
        Some(other) => bail!("GITSTATE_LOG_FORMAT: {other:?} is neither text nor json"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_and_http_targets_are_capped_at_info_and_ours_are_not() {
        use tracing::Level;
        let filter = pinned_log_targets();
        for target in gitstate_kms::SECRET_BEARING_LOG_TARGETS
            .iter()
            .flat_map(|t| [t.to_string(), format!("{t}::client::orchestrator")])
        {
            assert!(filter.would_enable(&target, &Level::INFO), "{target}");
            assert!(!filter.would_enable(&target, &Level::DEBUG), "{target}");
            assert!(!filter.would_enable(&target, &Level::TRACE), "{target}");
        }
        for target in ["gitstate_git::transport::http", "gitstate_kms", "gitstate"] {
            assert!(filter.would_enable(target, &Level::TRACE), "{target}");
        }
    }
}
