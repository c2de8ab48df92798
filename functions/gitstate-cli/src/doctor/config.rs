//! The `http` backend's settings as Terraform gathers them, and the checks that need no request.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{Backend, Finding, Setting, hcl_attributes};
use crate::backend_blocks;

/// The http backend's settings: name, environment variable (none for the two Terraform reads
/// from the configuration only), default.
const ATTRIBUTES: &[(&str, Option<&str>, Option<&str>)] = &[
    ("address", Some("TF_HTTP_ADDRESS"), None),
    ("update_method", Some("TF_HTTP_UPDATE_METHOD"), Some("POST")),
    ("lock_address", Some("TF_HTTP_LOCK_ADDRESS"), None),
    ("lock_method", Some("TF_HTTP_LOCK_METHOD"), Some("LOCK")),
    ("unlock_address", Some("TF_HTTP_UNLOCK_ADDRESS"), None),
    (
        "unlock_method",
        Some("TF_HTTP_UNLOCK_METHOD"),
        Some("UNLOCK"),
    ),
    ("username", Some("TF_HTTP_USERNAME"), None),
    ("password", Some("TF_HTTP_PASSWORD"), None),
    ("skip_cert_verification", None, None),
    ("retry_max", Some("TF_HTTP_RETRY_MAX"), None),
    ("retry_wait_min", Some("TF_HTTP_RETRY_WAIT_MIN"), None),
    ("retry_wait_max", Some("TF_HTTP_RETRY_WAIT_MAX"), None),
    (
        "client_ca_certificate_pem",
        Some("TF_HTTP_CLIENT_CA_CERTIFICATE_PEM"),
        None,
    ),
    (
        "client_certificate_pem",
        Some("TF_HTTP_CLIENT_CERTIFICATE_PEM"),
        None,
    ),
    (
        "client_private_key_pem",
        Some("TF_HTTP_CLIENT_PRIVATE_KEY_PEM"),
        None,
    ),
    // OpenTofu only.
    ("headers", None, None),
];

/// `gitstate doctor`'s arguments: Terraform's own where they say the same thing.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// Terraform's working directory, as `terraform -chdir=DIR` [default: .].
    #[arg(long, value_name = "DIR")]
    chdir: Option<PathBuf>,
    /// As `terraform init -backend-config=…`: a file of settings or KEY=VALUE (repeatable).
    /// Without it, what the last `terraform init` saved in .terraform/ counts.
    #[arg(long = "backend-config", value_name = "FILE|KEY=VALUE")]
    backend_config: Vec<String>,
    /// Also take the lock at lock_address and release it at unlock_address, as `terraform plan`
    /// does (a lock ref is written and removed in the repository).
    #[arg(long)]
    pub lock: bool,
}

impl Args {
    pub fn dir(&self) -> PathBuf {
        self.chdir.clone().unwrap_or_else(|| PathBuf::from("."))
    }

    #[cfg(test)]
    pub fn for_tests(dir: &Path, backend_config: &[&str]) -> Self {
        Self {
            chdir: Some(dir.to_path_buf()),
            backend_config: backend_config.iter().map(|s| (*s).to_owned()).collect(),
            lock: false,
        }
    }
}

/// One backend (or `cloud`) block found in the configuration.
struct Declaration {
    at: String,
    kind: String,
    is_override: bool,
    /// name, literal value (None: an expression), place.
    attributes: Vec<(String, Option<String>, String)>,
}

/// The backend Terraform will use in `dir`, with every value and where it came from; findings
/// about the configuration itself. `None` when it is not an `http` backend.
pub fn read(
    dir: &Path,
    args: &Args,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<(Option<Backend>, Vec<Finding>)> {
    let mut findings = Vec::new();
    let Some(block) = http_block(dir, &mut findings)? else {
        return Ok((None, findings));
    };
    let mut backend = Backend {
        declared: block.at.clone(),
        ..Backend::default()
    };
    block_values(block, &mut backend, &mut findings);
    backend_configs(dir, args, &mut backend, &mut findings)?;
    saved(dir, env, args, &mut backend, &mut findings)?;
    env_and_defaults(env, &mut backend);
    Ok((Some(backend), findings))
}

/// The backend block Terraform uses in `dir` when it is an `http` one; otherwise why not.
fn http_block(dir: &Path, findings: &mut Vec<Finding>) -> anyhow::Result<Option<Declaration>> {
    let declarations = declarations(dir)?;
    let (main, overrides): (Vec<_>, Vec<_>) =
        declarations.into_iter().partition(|d| !d.is_override);
    if main.len() > 1 {
        findings.push(
            Finding::problem(
                "duplicate-backend",
                format!(
                    "more than one backend block: {}",
                    main.iter()
                        .map(|d| d.at.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                "keep one backend \"http\" block".to_owned(),
            )
            .says("Duplicate backend configuration"),
        );
    }
    // An override file's backend block replaces the main one.
    let Some(block) = overrides.into_iter().last().or(main.into_iter().next()) else {
        findings.push(
            Finding::problem(
                "no-backend",
                format!(
                    "no backend block in {}: Terraform keeps the state in a local \
                     terraform.tfstate, not in gitstate",
                    dir.display()
                ),
                "add the block `gitstate serve` prints (terraform { backend \"http\" { address \
                 = …, lock_address = …, unlock_address = … } }), or run Terraform through \
                 `gitstate run -- terraform …`"
                    .to_owned(),
            )
            .says("nothing: plan and apply use the local state"),
        );
        return Ok(None);
    };
    if block.kind != "http" {
        findings.push(Finding::problem(
            "other-backend",
            format!(
                "{} declares backend {:?}: the state is kept there, not in gitstate",
                block.at, block.kind
            ),
            "replace it with backend \"http\" pointing at gitstate (the block `gitstate serve` \
             prints), then `terraform init -migrate-state`"
                .to_owned(),
        ));
        return Ok(None);
    }
    Ok(Some(block))
}

/// The block's own values; an expression is a finding, not a value.
fn block_values(block: Declaration, backend: &mut Backend, findings: &mut Vec<Finding>) {
    for (key, value, at) in block.attributes {
        match value {
            Some(value) => set(backend, &key, value, at, findings),
            None => findings.push(
                Finding::problem(
                    "not-literal",
                    format!("{at}: `{key}` is an expression; a backend block takes literal values"),
                    format!("write `{key}` as a quoted string, or pass it with -backend-config or TF_HTTP_*"),
                )
                .says("Variables not allowed"),
            ),
        }
    }
}

/// `-backend-config` pairs and files, in the order given.
fn backend_configs(
    dir: &Path,
    args: &Args,
    backend: &mut Backend,
    findings: &mut Vec<Finding>,
) -> anyhow::Result<()> {
    for given in &args.backend_config {
        match given.split_once('=') {
            Some((key, value)) if !key.contains('/') && !key.contains('.') => set(
                backend,
                key.trim(),
                value.to_owned(),
                format!("-backend-config {key}=…"),
                findings,
            ),
            _ => {
                let path = dir.join(given);
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("-backend-config {given}: cannot read it"))?;
                for (key, value, at) in hcl_attributes(&path, &text)? {
                    if let Some(value) = value {
                        set(
                            backend,
                            &key,
                            value,
                            format!("-backend-config {at}"),
                            findings,
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// `TF_HTTP_*` variables, then Terraform's defaults, for what is still unset.
fn env_and_defaults(env: &dyn Fn(&str) -> Option<String>, backend: &mut Backend) {
    for (key, var, default) in ATTRIBUTES {
        if backend.values.contains_key(*key) {
            continue;
        }
        if let Some(value) = var.and_then(env) {
            backend.values.insert(
                (*key).to_owned(),
                Setting {
                    value,
                    from: format!("env {}", var.unwrap_or_default()),
                },
            );
        } else if let Some(default) = default {
            backend.values.insert(
                (*key).to_owned(),
                Setting {
                    value: (*default).to_owned(),
                    from: "default".to_owned(),
                },
            );
        }
    }
}

fn set(backend: &mut Backend, key: &str, value: String, from: String, findings: &mut Vec<Finding>) {
    if !ATTRIBUTES.iter().any(|(k, _, _)| *k == key) {
        findings.push(
            Finding::problem(
                "unknown-setting",
                format!("{from}: the http backend has no setting `{key}`"),
                format!(
                    "remove it or correct its name (the settings are {})",
                    ATTRIBUTES
                        .iter()
                        .map(|(k, _, _)| *k)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
            .says("Unsupported argument / Invalid backend configuration argument"),
        );
        return;
    }
    backend
        .values
        .insert(key.to_owned(), Setting { value, from });
}

/// What the last `terraform init` saved: the backend kind, and (without `--backend-config`) the
/// values it was given then.
fn saved(
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    args: &Args,
    backend: &mut Backend,
    findings: &mut Vec<Finding>,
) -> anyhow::Result<()> {
    let path = super::data_dir(dir, env).join("terraform.tfstate");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            findings.push(Finding::note(
                "not-initialised",
                format!(
                    "{} does not exist: `terraform init` has not run here",
                    path.display()
                ),
            ));
            return Ok(());
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let saved: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let kind = saved["backend"]["type"].as_str().unwrap_or("local");
    if kind != "http" {
        findings.push(Finding::problem(
            "reinit",
            format!(
                "{} says this directory was initialised for backend {kind:?}: Terraform stops \
                 with \"Backend initialization required\"",
                path.display()
            ),
            "terraform init -migrate-state (copies the state it holds) or terraform init \
             -reconfigure"
                .to_owned(),
        ));
        return Ok(());
    }
    if !args.backend_config.is_empty() {
        return Ok(());
    }
    if let Some(config) = saved["backend"]["config"].as_object() {
        for (key, value) in config {
            let value = match value {
                serde_json::Value::String(s) if !s.is_empty() => s.clone(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Number(n) => n.to_string(),
                _ => continue,
            };
            if !backend.values.contains_key(key) && ATTRIBUTES.iter().any(|(k, _, _)| k == key) {
                backend.values.insert(
                    key.clone(),
                    Setting {
                        value,
                        from: "saved by terraform init in .terraform/terraform.tfstate".to_owned(),
                    },
                );
            }
        }
    }
    Ok(())
}

/// Every backend and `cloud` block of the configuration in `dir`.
fn declarations(dir: &Path) -> anyhow::Result<Vec<Declaration>> {
    let mut found = Vec::new();
    for file in backend_blocks::configuration_files(dir)? {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        for block in backend_blocks::blocks(&file, &text)? {
            found.push(Declaration {
                at: block.place(),
                attributes: block
                    .attributes
                    .iter()
                    .map(|a| (a.key.clone(), a.value.clone(), block.place_of(a)))
                    .collect(),
                kind: block.kind,
                is_override: block.is_override,
            });
        }
    }
    Ok(found)
}

/// A value as printed: secrets and PEM blocks are not shown.
pub fn shown(key: &str, value: &str) -> String {
    match key {
        "password" | "client_private_key_pem" => "(set)".to_owned(),
        k if k.ends_with("_pem") => format!("(PEM, {} bytes)", value.len()),
        _ => value.to_owned(),
    }
}
