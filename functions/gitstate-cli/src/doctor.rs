//! `gitstate doctor`: run in a Terraform working directory, it reads the `http` backend's
//! configuration as Terraform would (the block, `-backend-config`, what `init` saved, the
//! `TF_HTTP_*` variables), makes the requests Terraform would make, and prints for each what the
//! backend answered, why, and what to do. Terraform itself drops the backend's reasons ("HTTP
//! remote state endpoint invalid auth", "Unexpected HTTP response code 400").

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use hcl_edit::Span;

use crate::backend_blocks::{line_of, literal};

mod config;
mod probe;
mod rules;

pub use config::Args;

/// How long one request may take before the backend counts as not answering.
const TIMEOUT: Duration = Duration::from_secs(15);

/// What one check found.
#[derive(Debug)]
pub struct Finding {
    pub level: Level,
    /// A short name of the class (`wrong-path`, `grant` …): documented in docs/terraform.md.
    pub code: &'static str,
    pub what: String,
    pub fix: Option<String>,
    /// What Terraform prints in this case, for the reader who came from there.
    pub terraform: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    Note,
    Problem,
}

impl Finding {
    fn ok(code: &'static str, what: String) -> Self {
        Self {
            level: Level::Ok,
            code,
            what,
            fix: None,
            terraform: None,
        }
    }

    fn note(code: &'static str, what: String) -> Self {
        Self {
            level: Level::Note,
            ..Self::ok(code, what)
        }
    }

    fn problem(code: &'static str, what: String, fix: String) -> Self {
        Self {
            level: Level::Problem,
            fix: Some(fix),
            ..Self::ok(code, what)
        }
    }

    fn says(mut self, terraform: &'static str) -> Self {
        self.terraform = Some(terraform);
        self
    }
}

/// `gitstate doctor`: exits non-zero when anything is wrong.
pub async fn doctor(args: &Args) -> anyhow::Result<()> {
    let dir = args.dir();
    if !dir.is_dir() {
        bail!("{}: no such directory", dir.display());
    }
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (backend, mut findings) = config::read(&dir, args, &env)?;
    let mut out = String::new();
    writeln!(out, "gitstate doctor in {}", dir.display())?;
    if let Some(backend) = &backend {
        writeln!(out, "backend \"http\" at {}", backend.declared)?;
        for (key, setting) in &backend.values {
            writeln!(
                out,
                "  {key:<26} {:<60} ({})",
                config::shown(key, &setting.value),
                setting.from
            )?;
        }
        findings.extend(rules::check(backend));
        if findings
            .iter()
            .all(|f| f.level != Level::Problem || f.code != "no-address")
        {
            findings.extend(probe::run(backend, args.lock).await);
        }
    }
    writeln!(out)?;
    for finding in &findings {
        let label = match finding.level {
            Level::Ok => "ok     ",
            Level::Note => "note   ",
            Level::Problem => "PROBLEM",
        };
        writeln!(out, "{label} [{}] {}", finding.code, finding.what)?;
        if let Some(fix) = &finding.fix {
            writeln!(out, "        fix: {fix}")?;
        }
        if let Some(says) = finding.terraform {
            writeln!(out, "        Terraform prints: {says}")?;
        }
    }
    let problems = findings
        .iter()
        .filter(|f| f.level == Level::Problem)
        .count();
    if problems == 0 {
        writeln!(
            out,
            "\nok: Terraform reads{} this state through gitstate",
            if args.lock { ", locks and unlocks" } else { "" }
        )?;
    }
    if problems > 0 {
        writeln!(
            out,
            "\n{problems} problem{} found: see the fixes above",
            if problems == 1 { "" } else { "s" }
        )?;
    }
    print!("{out}");
    if problems > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// Where an attribute of a parsed block is: `file:line`.
fn place(file: &Path, text: &str, span: Option<std::ops::Range<usize>>) -> String {
    format!(
        "{}:{}",
        file.file_name().map_or_else(
            || file.display().to_string(),
            |n| n.to_string_lossy().into()
        ),
        line_of(text, span.map_or(0, |s| s.start))
    )
}

/// A `-backend-config` file or any HCL body: its attributes, with their places.
fn hcl_attributes(
    file: &Path,
    text: &str,
) -> anyhow::Result<Vec<(String, Option<String>, String)>> {
    let body = hcl_edit::parser::parse_body(text)
        .map_err(|e| anyhow::anyhow!("{}: cannot parse ({e})", file.display()))?;
    Ok(body
        .attributes()
        .map(|a| {
            (
                a.key.as_str().to_owned(),
                literal(&a.value),
                place(file, text, a.span()),
            )
        })
        .collect())
}

/// The data directory: `TF_DATA_DIR`, else `.terraform`, under `dir`.
fn data_dir(dir: &Path, env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    env("TF_DATA_DIR").map_or_else(|| dir.join(".terraform"), |d| dir.join(d))
}

/// The values of a `backend "http"` block as gathered from every source.
#[derive(Debug, Default)]
pub struct Backend {
    /// `file:line` of the block.
    pub declared: String,
    pub values: BTreeMap<String, Setting>,
}

#[derive(Debug, Clone)]
pub struct Setting {
    pub value: String,
    /// Where it came from: `main.tf:3`, `-backend-config backend.hcl:2`, `env TF_HTTP_…`.
    pub from: String,
}

impl Backend {
    fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(|s| s.value.as_str())
    }

    fn from(&self, key: &str) -> &str {
        self.values.get(key).map_or("", |s| s.from.as_str())
    }
}

#[cfg(test)]
mod tests;
