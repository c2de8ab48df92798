//! terraform-backend-git ("the seed"): its settings, read where its users already set them.
//! Its variables (`TF_BACKEND_GIT_*`, `GIT_USERNAME`, `GIT_PASSWORD`/`GITHUB_TOKEN`, …) and its
//! `terraform-backend-git.hcl` each stand for one gitstate setting. They fill only what
//! gitstate's own names (flag, `GITSTATE_*` variable, `gitstate.toml`) leave unset, and
//! `gitstate config` names the seed source a value came from; one that gitstate.toml sets to
//! another value is an error naming both. Where the seed's interface is used,
//! its defaults apply: branch `master`, port 6061.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{LayerError, Layered, Origin, SETTINGS, Spec};

pub mod ssh;

/// The seed's configuration file, read from the working directory (or `--config PATH.hcl`).
pub const HCL_FILE: &str = "terraform-backend-git.hcl";

/// The seed's listen address when none is given.
pub const SEED_LISTEN: &str = "127.0.0.1:6061";

/// The seed's branch when none is given.
pub const SEED_REF: &str = gitstate_core::SEED_BRANCH;

/// The seed's names that other tools use too (a CI job exports `GITHUB_TOKEN` for every step):
/// read only where the seed is in use ([`Seed::in_use`]), so that a gitstate set-up never sends
/// a token meant for one host to another.
pub const GENERIC_VARIABLES: &[&str] = &["GIT_USERNAME", "GIT_PASSWORD", "GITHUB_TOKEN"];

/// The seed's variables and the gitstate setting each stands for. Where two name one setting,
/// the first set wins (`GIT_PASSWORD` before `GITHUB_TOKEN`).
pub const SEED_VARIABLES: &[(&str, &str)] = &[
    ("TF_BACKEND_GIT_GIT_REPOSITORY", "GITSTATE_REPOSITORY"),
    ("TF_BACKEND_GIT_GIT_REF", "GITSTATE_REF"),
    ("TF_BACKEND_GIT_GIT_STATE", "GITSTATE_STATE"),
    ("TF_BACKEND_GIT_ADDRESS", "GITSTATE_LISTEN"),
    ("TF_BACKEND_GIT_ACCESSLOGS", "GITSTATE_ACCESS_LOG"),
    ("GIT_USERNAME", "GITSTATE_GIT_USERNAME"),
    ("GIT_PASSWORD", "GITSTATE_GIT_TOKEN"),
    ("GITHUB_TOKEN", "GITSTATE_GIT_TOKEN"),
    ("TF_BACKEND_GIT_HTTPS_CERT", "GITSTATE_TLS_CERT"),
    ("TF_BACKEND_GIT_HTTPS_KEY", "GITSTATE_TLS_KEY"),
    ("TF_BACKEND_GIT_HTTP_USERNAME", "GITSTATE_ADMIN_USER"),
    (
        "TF_BACKEND_HTTP_ENCRYPTION_PASSPHRASE",
        "GITSTATE_PASSPHRASE",
    ),
];

/// The seed's sops variables, read by the encryption settings under these names (where
/// gitstate's own names for the same thing are unset): OpenPGP fingerprints, age recipients,
/// the Shamir threshold, and the KMS keys with their encryption context.
pub const SEED_SOPS_VARIABLES: &[&str] = &[
    "TF_BACKEND_HTTP_SOPS_PGP_FP",
    "TF_BACKEND_HTTP_SOPS_AGE_RECIPIENTS",
    "TF_BACKEND_HTTP_SOPS_SHAMIR_THRESHOLD",
    "TF_BACKEND_HTTP_SOPS_AWS_KMS_ARNS",
    "TF_BACKEND_HTTP_SOPS_AWS_KMS_CONTEXT",
    // Not served (see settings/encryption.rs): read only to refuse them loudly.
    "TF_BACKEND_HTTP_SOPS_GCP_KMS_KEYS",
    "TF_BACKEND_HTTP_SOPS_HC_VAULT_URIS",
    SEED_PROVIDER,
];

/// The seed's Basic-auth password: hashed (argon2id) into the bootstrap administrator
/// (`GITSTATE_ADMIN_HASH`), whose name is `TF_BACKEND_GIT_HTTP_USERNAME`.
pub const SEED_PASSWORD: &str = "TF_BACKEND_GIT_HTTP_PASSWORD";

/// The seed's encryption switch: `aes` (the passphrase) or `sops`.
pub const SEED_PROVIDER: &str = "TF_BACKEND_HTTP_ENCRYPTION_PROVIDER";

/// The keys of `terraform-backend-git.hcl` (compared in lower case, as the seed does) and the
/// setting each stands for.
pub const HCL_KEYS: &[(&str, &str)] = &[
    ("git.repository", "GITSTATE_REPOSITORY"),
    ("git.ref", "GITSTATE_REF"),
    ("git.state", "GITSTATE_STATE"),
    ("address", "GITSTATE_LISTEN"),
    ("accesslogs", "GITSTATE_ACCESS_LOG"),
];

/// What the seed's sources say for this run.
pub struct Seed<'a> {
    /// The process environment (or a map, in tests).
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// `terraform-backend-git.hcl` as found (path and text).
    pub hcl: Option<(&'a Path, &'a str)>,
    /// The seed's command-line form was used (`gitstate [opts] git …`, or its standalone form):
    /// its listen address applies by default.
    pub interface: bool,
}

impl Seed<'_> {
    /// Whether the seed is in use here: its command line, its file, or one of its own
    /// `TF_BACKEND_GIT_*` variables.
    pub fn in_use(&self) -> bool {
        self.interface
            || self.hcl.is_some()
            || SEED_VARIABLES.iter().any(|(name, _)| {
                name.starts_with("TF_BACKEND_GIT_")
                    && (self.env)(name).is_some_and(|v| !v.trim().is_empty())
            })
    }
}

/// The seed's address spelling as gitstate reads it: `:6061` is every interface (as in Go),
/// `localhost:P` the loopback one.
pub fn listen_address(value: &str) -> String {
    let value = value.trim();
    if let Some(port) = value.strip_prefix(':') {
        format!("0.0.0.0:{port}")
    } else if let Some(port) = value.strip_prefix("localhost:") {
        format!("127.0.0.1:{port}")
    } else {
        value.to_owned()
    }
}

/// The file for this run: `explicit` (must exist) or `./terraform-backend-git.hcl` if present.
pub fn find_hcl(explicit: Option<&Path>) -> Result<Option<(PathBuf, String)>, LayerError> {
    let (path, required) = match explicit {
        Some(path) => (path.to_path_buf(), true),
        None => (PathBuf::from(HCL_FILE), false),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some((path, text))),
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LayerError::Read { path, source }),
    }
}

impl Layered {
    /// Fill what gitstate's own sources left unset from the seed's: its variables, then its HCL
    /// file, then its defaults (branch `master` when the repository came from the seed or its
    /// interface is used; port 6061 with its interface).
    pub fn with_seed(mut self, seed: &Seed<'_>) -> Result<Self, LayerError> {
        let present = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
        let provider = present((seed.env)(SEED_PROVIDER));
        match provider.as_deref().map(str::trim) {
            None | Some("aes" | "sops") => {}
            Some(other) => {
                return Err(LayerError::Seed(format!(
                    "{SEED_PROVIDER}: {other:?} is neither aes nor sops"
                )));
            }
        }
        let hcl = match seed.hcl {
            Some((path, text)) => parse_hcl(path, text)?,
            None => BTreeMap::new(),
        };
        let in_use = seed.in_use();
        for spec in SETTINGS {
            let sops = provider.as_deref() == Some("sops");
            let from_env = seed_variable(seed, spec.var, in_use, sops);
            let chosen = from_env.or_else(|| {
                let (path, _) = seed.hcl?;
                let value = hcl.get(spec.var)?.clone();
                Some((value, Origin::SeedFile(path.to_path_buf())))
            });
            let Some((value, origin)) = chosen else {
                continue;
            };
            let value = if spec.var == "GITSTATE_LISTEN" {
                listen_address(&value)
            } else {
                value
            };
            match self.values.get(spec.var) {
                None => {
                    self.values.insert(spec.var, (value, origin));
                }
                Some((own, Origin::File(file))) if !same(spec, own, &value) => {
                    return Err(disagreement(spec, (own, file), (&value, &origin)));
                }
                // A flag or GITSTATE_* variable outranks the seed's names; an agreeing file
                // keeps its origin.
                Some(_) => {}
            }
        }
        if provider.as_deref() == Some("aes") && !self.values.contains_key("GITSTATE_PASSPHRASE") {
            return Err(LayerError::Seed(format!(
                "{SEED_PROVIDER}=aes needs TF_BACKEND_HTTP_ENCRYPTION_PASSPHRASE (or \
                 GITSTATE_PASSPHRASE)"
            )));
        }
        if !self.values.contains_key("GITSTATE_ADMIN_HASH")
            && let Some(password) = present((seed.env)(SEED_PASSWORD))
        {
            self.seed_password = Some(gitstate_core::secret::Secret::new(password));
            self.values.insert(
                "GITSTATE_ADMIN_HASH",
                (String::new(), Origin::SeedEnv(SEED_PASSWORD)),
            );
        }
        for name in SEED_SOPS_VARIABLES {
            if let Some(value) = present((seed.env)(name)) {
                self.seed_sops.insert(name, value);
            }
        }
        let seed_repository = matches!(
            self.origin("GITSTATE_REPOSITORY"),
            Some(Origin::SeedEnv(_) | Origin::SeedFile(_))
        );
        if (seed.interface || seed_repository) && !self.values.contains_key("GITSTATE_REF") {
            self.values
                .insert("GITSTATE_REF", (SEED_REF.to_owned(), Origin::SeedDefault));
        }
        if seed.interface && !self.values.contains_key("GITSTATE_LISTEN") {
            self.values.insert(
                "GITSTATE_LISTEN",
                (SEED_LISTEN.to_owned(), Origin::SeedDefault),
            );
        }
        Ok(self)
    }
}

/// Whether a gitstate.toml value and a seed value of `spec` mean the same.
fn same(spec: &Spec, own: &str, seed: &str) -> bool {
    let (own, seed) = (own.trim(), seed.trim());
    let switch = |v: &str| match v {
        "true" | "1" => Some(true),
        "false" | "0" => Some(false),
        _ => None,
    };
    if let (true, Some(own), Some(seed)) = (spec.switch, switch(own), switch(seed)) {
        own == seed
    } else if spec.var == "GITSTATE_LISTEN" {
        listen_address(own) == seed
    } else {
        own == seed
    }
}

/// A seed variable (or `terraform-backend-git.hcl` key) set to another value than gitstate.toml
/// gives the same setting: neither is taken. The file used to win silently, so a CI job's
/// `TF_BACKEND_GIT_GIT_STATE` lost to a file added for local use. Secrets are named, never shown.
fn disagreement(
    spec: &Spec,
    (own, file): (&str, &Path),
    (value, origin): (&str, &Origin),
) -> LayerError {
    let seed = match origin {
        Origin::SeedFile(path) => {
            let key = HCL_KEYS
                .iter()
                .find(|(_, var)| *var == spec.var)
                .map_or("?", |(key, _)| key);
            format!("`{key}` in {}", path.display())
        }
        Origin::SeedEnv(var) => (*var).to_owned(),
        other => other.to_string(),
    };
    let file = format!("`{}` in {}", spec.key(), file.display());
    let both = if spec.secret {
        format!("{seed} and {file} hold different values")
    } else {
        format!(
            "{seed} says {:?} but {file} says {:?}",
            super::redact_userinfo(value),
            super::redact_userinfo(own)
        )
    };
    let flag = if spec.secret {
        String::new()
    } else {
        format!(" (or --{})", spec.flag())
    };
    LayerError::Seed(format!(
        "{both}: which one is meant is not clear, so neither is taken. Make them agree, unset \
         one, or choose with {}{flag}, which outranks both",
        spec.var,
    ))
}

/// The first of the seed's variables for gitstate's `var` that is set, and where it came from.
/// The generic names count only where the seed is in use; the passphrase is the aes mode's,
/// and under `sops` means nothing to the seed.
fn seed_variable(seed: &Seed<'_>, var: &str, in_use: bool, sops: bool) -> Option<(String, Origin)> {
    SEED_VARIABLES
        .iter()
        .filter(|(_, to)| *to == var)
        .filter(|(name, _)| in_use || !GENERIC_VARIABLES.contains(name))
        .filter(|(name, _)| *name != "TF_BACKEND_HTTP_ENCRYPTION_PASSPHRASE" || !sops)
        .find_map(|(name, _)| {
            (seed.env)(name)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (v, Origin::SeedEnv(name)))
        })
}

/// The seed's file: HCL as its Go reader took it (HCL 1: `git.repository = "…"`, or blocks
/// `git { repository = "…" }`; `#`, `//` and `/* */` comments), flattened to dotted keys. No
/// maintained Rust crate reads HCL 1's dotted names (HCL 2 refuses them), hence this small
/// reader; anything beyond strings, numbers and booleans is refused with its line.
pub fn parse_hcl(path: &Path, text: &str) -> Result<BTreeMap<&'static str, String>, LayerError> {
    let syntax = |line: usize, reason: &str| LayerError::Syntax {
        path: path.to_path_buf(),
        reason: format!("line {line}: {reason}"),
    };
    let tokens = tokenize(text).map_err(|(line, reason)| syntax(line, &reason))?;
    let mut out = BTreeMap::new();
    let mut prefix: Vec<String> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let (line, token) = &tokens[i];
        match token {
            Token::Close => {
                if prefix.pop().is_none() {
                    return Err(syntax(*line, "`}` without a block"));
                }
                i += 1;
            }
            Token::Word(key) | Token::Text(key) => {
                let mut key = key.clone();
                let mut next = i + 1;
                // `git "x" { … }`-style labels are not the seed's; a string key is.
                match tokens.get(next).map(|(_, t)| t) {
                    Some(Token::Equals) => next += 1,
                    Some(Token::Open) => {}
                    _ => return Err(syntax(*line, &format!("`{key}` needs `=` or `{{`"))),
                }
                match tokens.get(next).map(|(_, t)| t) {
                    Some(Token::Open) => {
                        prefix.push(std::mem::take(&mut key));
                        i = next + 1;
                    }
                    Some(Token::Text(value) | Token::Word(value)) => {
                        if matches!(&tokens[next].1, Token::Word(w) if !is_scalar_word(w)) {
                            return Err(syntax(
                                tokens[next].0,
                                &format!("`{value}` is not a string, number or boolean"),
                            ));
                        }
                        let full = prefix
                            .iter()
                            .chain(std::iter::once(&key))
                            .map(|k| k.to_ascii_lowercase())
                            .collect::<Vec<_>>()
                            .join(".");
                        let Some((_, var)) = HCL_KEYS.iter().find(|(k, _)| *k == full) else {
                            let known: Vec<&str> = HCL_KEYS.iter().map(|(k, _)| *k).collect();
                            return Err(LayerError::UnknownKey {
                                path: path.to_path_buf(),
                                key: full,
                                hint: format!(" (the seed's keys: {})", known.join(", ")),
                            });
                        };
                        out.insert(*var, value.clone());
                        i = next + 1;
                        if matches!(tokens.get(i).map(|(_, t)| t), Some(Token::Comma)) {
                            i += 1;
                        }
                    }
                    _ => {
                        return Err(syntax(
                            *line,
                            &format!("`{key}` needs a string, number or boolean"),
                        ));
                    }
                }
            }
            _ => return Err(syntax(*line, "expected a key")),
        }
    }
    if !prefix.is_empty() {
        return Err(syntax(
            text.lines().count().max(1),
            &format!("block `{}` is not closed", prefix.join(".")),
        ));
    }
    Ok(out)
}

fn is_scalar_word(word: &str) -> bool {
    word == "true" || word == "false" || word.parse::<f64>().is_ok()
}

#[derive(Debug, PartialEq)]
enum Token {
    /// A bare word: a key (letters, digits, `_`, `-`, `.`) or a number or boolean.
    Word(String),
    /// A quoted string, escapes resolved.
    Text(String),
    Equals,
    Open,
    Close,
    Comma,
}

/// Tokens with their line numbers; an error is (line, reason).
fn tokenize(text: &str) -> Result<Vec<(usize, Token)>, (usize, String)> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' => line += 1,
            c if c.is_whitespace() => {}
            '#' => {
                if chars.by_ref().any(|c| c == '\n') {
                    line += 1;
                }
            }
            '/' if chars.peek() == Some(&'/') => {
                if chars.by_ref().any(|c| c == '\n') {
                    line += 1;
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let start = line;
                let mut last = ' ';
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                    }
                    if last == '*' && c == '/' {
                        closed = true;
                        break;
                    }
                    last = c;
                }
                if !closed {
                    return Err((start, "a /* comment is not closed".into()));
                }
            }
            '=' => out.push((line, Token::Equals)),
            '{' => out.push((line, Token::Open)),
            '}' => out.push((line, Token::Close)),
            ',' => out.push((line, Token::Comma)),
            '"' => out.push((line, Token::Text(quoted(&mut chars, line)?))),
            c if c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '+') => {
                let mut word = String::from(c);
                while let Some(&c) = chars.peek() {
                    if c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '+') {
                        word.push(c);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push((line, Token::Word(word)));
            }
            other => return Err((line, format!("unexpected {other:?}"))),
        }
    }
    Ok(out)
}

/// The rest of a quoted string whose `"` opened on `line`, its escapes resolved.
fn quoted(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    line: usize,
) -> Result<String, (usize, String)> {
    let mut value = String::new();
    loop {
        match chars.next() {
            None | Some('\n') => return Err((line, "a string is not closed".into())),
            Some('"') => return Ok(value),
            Some('\\') => match chars.next() {
                Some('n') => value.push('\n'),
                Some('t') => value.push('\t'),
                Some('r') => value.push('\r'),
                Some('"') => value.push('"'),
                Some('\\') => value.push('\\'),
                other => {
                    return Err((line, format!("unknown escape \\{}", other.unwrap_or(' '))));
                }
            },
            Some(c) => value.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rand::seq::IndexedRandom;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn lookup(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn quote(value: &str) -> String {
        let mut out = String::from("\"");
        for c in value.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    /// Generated files: every subset of the seed's keys, each written in one of the spellings
    /// its reader took (dotted, a block, a quoted key, any case), with comments and blank space
    /// between, and values holding quotes, backslashes and tabs: each reads back as written.
    #[test]
    fn generated_hcl_files_read_back() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(25);
        let alphabet: Vec<char> = "ab/._-:@ \"\\\t=#{}é1".chars().collect();
        let gaps = [
            "\n",
            " \n\n",
            "\n# a comment = \"x\"\n",
            "\n// c\n",
            "\n/* a\n b */\n",
        ];
        for case in 0..400 {
            let mut expected = BTreeMap::new();
            let mut text = String::new();
            for (key, var) in HCL_KEYS {
                if !rng.random_bool(0.6) {
                    continue;
                }
                let len = rng.random_range(1..12);
                let value: String = (0..len)
                    .map(|_| *alphabet.choose(&mut rng).expect("letters"))
                    .collect();
                let key = if rng.random_bool(0.3) {
                    key.to_ascii_uppercase()
                } else {
                    (*key).to_owned()
                };
                let line = match (key.split_once('.'), rng.random_range(0..3)) {
                    (Some((block, inner)), 0) => {
                        format!("{block} {{\n  {inner} = {}\n}}", quote(&value))
                    }
                    (_, 1) => format!("{} = {}", quote(&key), quote(&value)),
                    _ => format!("{key}={}", quote(&value)),
                };
                text.push_str(&line);
                text.push_str(gaps.choose(&mut rng).expect("gaps"));
                expected.insert(*var, value);
            }
            let read = parse_hcl(Path::new("t.hcl"), &text)
                .unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
            assert_eq!(read, expected, "case {case}:\n{text}");
        }
        let bools = parse_hcl(
            Path::new("t.hcl"),
            "accessLogs = true\naddress = \":6061\"\n",
        )
        .expect("valid");
        assert_eq!(bools["GITSTATE_ACCESS_LOG"], "true");
        assert_eq!(listen_address(&bools["GITSTATE_LISTEN"]), "0.0.0.0:6061");
    }

    /// Files the reader refuses say where and why; none is half read.
    #[test]
    fn bad_hcl_files_are_refused_with_their_line() {
        for (text, says) in [
            ("git.repository = \"x\ngit.ref = \"y\"\n", "line 1"),
            ("git.repo = \"x\"\n", "unknown key `git.repo`"),
            ("state = \"x\"\n", "unknown key `state`"),
            ("git.ref = [\"a\"]\n", "line 1"),
            ("git {\n ref = \"a\"\n", "not closed"),
            ("}\n", "without a block"),
            ("git.ref \"a\"\n", "needs `=`"),
            ("\n\ngit.ref = main\n", "line 3"),
            ("/* open\n", "not closed"),
            ("git.ref = \"\\q\"\n", "escape"),
        ] {
            let e = parse_hcl(Path::new("t.hcl"), text)
                .expect_err(text)
                .to_string();
            assert!(e.contains(says), "{text:?}: {e}");
            assert!(e.contains("t.hcl"), "{e}");
        }
    }

    /// For every seed variable and every combination of sources: gitstate's own flag or
    /// variable wins; a gitstate.toml value that the seed's variable or file contradicts is an
    /// error naming both (never showing a secret); else the file, the seed's variable, its
    /// file; `config` names the one used.
    #[test]
    fn gitstate_names_win_over_the_seeds_and_the_file_must_agree_with_them() {
        for (seed_var, var) in SEED_VARIABLES {
            let spec = super::super::SETTINGS
                .iter()
                .find(|s| s.var == *var)
                .expect("the variable names a setting");
            let key = spec.key();
            let hcl_key = HCL_KEYS.iter().find(|(_, v)| v == var).map(|(k, _)| *k);
            let generic = GENERIC_VARIABLES.contains(seed_var);
            for mask in 0..32u8 {
                // bit 16: the seed's command line is used (its interface)
                let interface = mask & 16 != 0;
                let own_env = lookup(&[(*var, "own-env".to_owned())]);
                let none = lookup(&[]);
                let toml = format!("{key} = \"own-file\"\n");
                let layered = Layered::build(
                    |_| None,
                    |v| if mask & 1 != 0 { own_env(v) } else { none(v) },
                    (mask & 2 != 0).then_some((Path::new("gitstate.toml"), toml.as_str())),
                )
                .expect("valid");
                let seed_env = lookup(&[(*seed_var, "seed-env".to_owned())]);
                let env = |v: &str| if mask & 4 != 0 { seed_env(v) } else { None };
                let hcl_text = hcl_key.map(|k| format!("{k} = \"seed-file\"\n"));
                let hcl = hcl_text
                    .as_deref()
                    .filter(|_| mask & 8 != 0)
                    .map(|t| (Path::new("terraform-backend-git.hcl"), t));
                let layered = layered.with_seed(&Seed {
                    env: &env,
                    hcl,
                    interface,
                });
                let in_use = interface
                    || hcl.is_some()
                    || (mask & 4 != 0 && seed_var.starts_with("TF_BACKEND_GIT_"));
                let seed_env = mask & 4 != 0 && (in_use || !generic);
                let seed_file = mask & 8 != 0 && hcl_key.is_some();
                if mask & 3 == 2 && (seed_env || seed_file) {
                    let e = layered
                        .expect_err("the file and the seed disagree")
                        .to_string();
                    let named = if seed_env {
                        (*seed_var).to_owned()
                    } else {
                        format!("`{}` in terraform-backend-git.hcl", hcl_key.unwrap_or("?"))
                    };
                    assert!(
                        e.contains(&named) && e.contains(&format!("`{key}` in gitstate.toml")),
                        "{seed_var} {mask}: {e}"
                    );
                    assert_eq!(
                        e.contains("own-file"),
                        !spec.secret,
                        "{seed_var} {mask}: {e}"
                    );
                    continue;
                }
                let layered = layered.expect("valid");
                let (want, origin) = if mask & 1 != 0 {
                    ("own-env", Origin::Env)
                } else if mask & 2 != 0 {
                    ("own-file", Origin::File("gitstate.toml".into()))
                } else if seed_env {
                    ("seed-env", Origin::SeedEnv(seed_var))
                } else if seed_file {
                    (
                        "seed-file",
                        Origin::SeedFile("terraform-backend-git.hcl".into()),
                    )
                } else {
                    // Where the interface is used, the seed's defaults (tested below) apply.
                    if !(interface && matches!(*var, "GITSTATE_REF" | "GITSTATE_LISTEN")) {
                        assert_eq!(layered.get(var), None, "{seed_var} mask {mask}");
                    }
                    continue;
                };
                assert_eq!(layered.get(var).as_deref(), Some(want), "{seed_var} {mask}");
                assert_eq!(layered.origin(var), Some(&origin), "{seed_var} {mask}");
            }
        }
    }

    /// A seed variable or HCL key that says what gitstate.toml says (in its own spelling: `:6061`,
    /// `1` for `true`) is no disagreement: the file's value stands.
    #[test]
    fn a_seed_value_that_agrees_with_the_file_is_no_error() {
        for (seed_var, var) in SEED_VARIABLES {
            let spec = super::super::SETTINGS
                .iter()
                .find(|s| s.var == *var)
                .expect("a setting");
            let (own, seed) = match *var {
                "GITSTATE_LISTEN" => ("0.0.0.0:6061", ":6061"),
                "GITSTATE_ACCESS_LOG" => ("true", "1"),
                _ => ("same-value", "same-value"),
            };
            let toml = format!("{} = \"{own}\"\n", spec.key());
            let env = lookup(&[(*seed_var, seed.to_owned())]);
            let layered = Layered::build(
                |_| None,
                |_| None,
                Some((Path::new("gitstate.toml"), toml.as_str())),
            )
            .expect("valid")
            .with_seed(&Seed {
                env: &env,
                hcl: None,
                interface: true,
            })
            .unwrap_or_else(|e| panic!("{seed_var}: {e}"));
            assert_eq!(layered.get(var).as_deref(), Some(own), "{seed_var}");
            assert_eq!(
                layered.origin(var),
                Some(&Origin::File("gitstate.toml".into()))
            );
        }
    }

    /// `master` and port 6061 are the defaults only where the seed's interface is used (its
    /// command line, or the repository from its variable or file).
    #[test]
    fn the_seeds_defaults_apply_where_its_interface_is_used() {
        let repo = "https://git.example/o/r".to_owned();
        for (own, seed_env, interface, master, port) in [
            (false, false, false, false, false),
            (true, false, false, false, false),
            (false, true, false, true, false),
            (true, true, false, false, false),
            (false, false, true, true, true),
            (true, false, true, true, true),
        ] {
            let own_env = lookup(&[("GITSTATE_REPOSITORY", repo.clone())]);
            let seed = lookup(&[("TF_BACKEND_GIT_GIT_REPOSITORY", repo.clone())]);
            let layered = Layered::build(|_| None, |v| if own { own_env(v) } else { None }, None)
                .expect("valid")
                .with_seed(&Seed {
                    env: &|v| if seed_env { seed(v) } else { None },
                    hcl: None,
                    interface,
                })
                .expect("valid");
            let settings = layered.settings(crate::Runtime::Local).expect("settings");
            let case = (own, seed_env, interface);
            assert_eq!(
                settings.git.branch.as_str(),
                if master { "master" } else { "main" },
                "{case:?}"
            );
            assert_eq!(
                settings.server.listen.port(),
                if port { 6061 } else { 8080 },
                "{case:?}"
            );
        }
    }

    #[test]
    fn the_seeds_password_becomes_the_bootstrap_administrator() {
        let env = lookup(&[
            ("TF_BACKEND_GIT_HTTP_USERNAME", "ci".to_owned()),
            (SEED_PASSWORD, "s3cret-pw".to_owned()),
        ]);
        let layered = Layered::default()
            .with_seed(&Seed {
                env: &env,
                hcl: None,
                interface: true,
            })
            .expect("valid");
        let shown = format!("{:?}", layered.report());
        assert!(!shown.contains("s3cret-pw"), "{shown}");
        let settings = layered.settings(crate::Runtime::Local).expect("settings");
        let (user, hash) = settings.access.bootstrap.expect("an administrator");
        assert_eq!(user, "ci");
        assert!(
            gitstate_core::password::PasswordVerifier::verify(
                &gitstate_core::password::Argon2id,
                hash.expose(),
                b"s3cret-pw"
            ),
            "the hash checks the seed's password"
        );
    }

    #[test]
    fn the_encryption_provider_is_checked() {
        for (provider, passphrase, ok) in [
            ("aes", true, true),
            ("aes", false, false),
            ("sops", false, true),
            ("kms", true, false),
        ] {
            let mut pairs = vec![(SEED_PROVIDER, provider.to_owned())];
            if passphrase {
                pairs.push(("TF_BACKEND_HTTP_ENCRYPTION_PASSPHRASE", "pp".to_owned()));
            }
            let env = lookup(&pairs);
            let result = Layered::default().with_seed(&Seed {
                env: &env,
                hcl: None,
                interface: false,
            });
            assert_eq!(result.is_ok(), ok, "{provider} {passphrase}");
        }
    }
}
