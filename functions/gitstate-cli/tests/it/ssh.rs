//! SSH remotes against a real `sshd` on loopback (Debian's openssh-server, started here with its
//! own host key and authorized key): `gitstate run` with terraform over `ssh://`, `git+ssh://`,
//! `ssh+git://` and `user@host:path`, and many `gitstate serve` processes racing for one lock over SSH.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{Client, git, lock_info};

const SSHD: &str = "/usr/sbin/sshd";

struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    child: std::process::Child,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen (Debian package openssh-client)");
    assert!(out.status.success(), "{out:?}");
}

impl Sshd {
    fn start() -> Self {
        assert!(
            Path::new(SSHD).is_file(),
            "{SSHD} is missing: apt-get install -y openssh-server"
        );
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd (privilege separation)");
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        keygen(&d.join("host_key"));
        keygen(&d.join("client_key"));
        std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).expect("authorized");
        let port = gitstate_tests::free_port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\n\
             PidFile {d}/sshd.pid\nMaxStartups 200\nMaxSessions 200\nLogLevel ERROR\n",
            d = d.display()
        );
        std::fs::write(d.join("sshd_config"), config).expect("config");
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(d.join("sshd.log")).expect("log"))
            .spawn()
            .expect("sshd starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "sshd did not listen: {}",
                std::fs::read_to_string(d.join("sshd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { dir, port, child }
    }

    /// GIT_SSH_COMMAND for this server's client key; `with_port` for the `user@host:path` form,
    /// which cannot name a port.
    fn ssh_command(&self, with_port: bool) -> String {
        let port = if with_port {
            format!(" -p {}", self.port)
        } else {
            String::new()
        };
        format!(
            "ssh -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
             -o BatchMode=yes -o LogLevel=ERROR{port}",
            self.dir.path().join("client_key").display()
        )
    }

    /// `repo` on this server: scp-like (`user@host:path`, the port from the ssh command) or
    /// an `ssh://` URL with the port.
    fn url(&self, repo: &Path, scp: bool) -> String {
        if scp {
            format!("{}@127.0.0.1:{}", Self::user(), repo.display())
        } else {
            self.url_as(repo, "ssh")
        }
    }

    /// `repo` on this server as a URL with the port, under `scheme` (`ssh`, or git's older
    /// spellings `git+ssh` and `ssh+git`).
    fn url_as(&self, repo: &Path, scheme: &str) -> String {
        format!(
            "{scheme}://{}@127.0.0.1:{}{}",
            Self::user(),
            self.port,
            repo.display()
        )
    }

    fn user() -> String {
        std::env::var("USER").unwrap_or_else(|_| "root".into())
    }

    fn bare_repo(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{name}.git"));
        git(
            &[
                "init",
                "--bare",
                "-q",
                "--initial-branch=main",
                path.to_str().expect("utf-8"),
            ],
            None,
        );
        path
    }
}

fn terraform_run(work: &Path, repository: &str, ssh: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(crate::GITSTATE)
        .args([
            "run",
            "--repository",
            repository,
            "--state",
            "ssh/app.tfstate",
            "--",
            "terraform",
        ])
        .args(args)
        .current_dir(work)
        .env("GIT_SSH_COMMAND", ssh)
        .env("TF_CLI_CONFIG_FILE", work.join("empty.tfrc"))
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .stdin(Stdio::null())
        .output()
        .expect("gitstate run");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn serial(repo: &Path) -> u64 {
    let out = git(
        &[
            "--git-dir",
            repo.to_str().expect("utf-8"),
            "show",
            "main:ssh/app.tfstate",
        ],
        None,
    );
    let state: serde_json::Value = serde_json::from_str(&out).expect("state");
    state["serial"].as_u64().expect("serial")
}

/// Terraform init and apply under `gitstate run` over `url`, from a new working directory that
/// is returned: the state lands at serial 1 and the lock ref is gone afterwards.
fn apply_once(repo: &Path, url: &str, ssh: &str, label: &str) -> tempfile::TempDir {
    let work = tempfile::tempdir().expect("tempdir");
    std::fs::write(work.path().join("empty.tfrc"), "").expect("tfrc");
    std::fs::write(
        work.path().join("main.tf"),
        format!("resource \"terraform_data\" \"x\" {{\n  input = \"{label}\"\n}}\n"),
    )
    .expect("main.tf");
    for args in [
        &["init", "-input=false"][..],
        &["apply", "-auto-approve"][..],
    ] {
        let (ok, out) = terraform_run(work.path(), url, ssh, args);
        assert!(ok, "{label} {args:?}: {out}");
    }
    assert_eq!(serial(repo), 1, "{label}");
    let lock_refs = git(
        &[
            "--git-dir",
            repo.to_str().expect("utf-8"),
            "for-each-ref",
            "refs/heads/locks/",
        ],
        None,
    );
    assert_eq!(
        lock_refs.trim(),
        "",
        "{label}: the lock was released over ssh"
    );
    work
}

#[test]
fn terraform_under_run_over_both_ssh_url_forms() {
    let sshd = Sshd::start();
    for (form, with_port) in [("url", false), ("scp", true)] {
        let repo = sshd.bare_repo(form);
        let url = sshd.url(&repo, with_port);
        let ssh = sshd.ssh_command(with_port);
        let work = apply_once(&repo, &url, &ssh, form);
        let broken = url.replace(&repo.display().to_string(), "/nonexistent/repo.git");
        let (ok, out) = terraform_run(work.path(), &broken, &ssh, &["plan", "-input=false"]);
        assert!(!ok, "a missing repository fails: {out}");
    }
}

/// git's older SSH spellings, `git+ssh://` and `ssh+git://`, against the real sshd: Terraform
/// under `gitstate run` over each (init and apply: serial 1, the lock released), then one
/// `gitstate serve` whose repository is the first and whose allowlist names the second, reached
/// through the seed's address format with the `+` escaped (`%2B`). Unescaped, the `+` reads as
/// a space: a 400 that says how to write it, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_and_the_seed_format_over_git_plus_ssh_and_ssh_plus_git() {
    let sshd = Sshd::start();
    let ssh = sshd.ssh_command(false);
    let mut repos = Vec::new();
    for scheme in ["git+ssh", "ssh+git"] {
        let repo = sshd.bare_repo(&scheme.replace('+', "-"));
        let url = sshd.url_as(&repo, scheme);
        apply_once(&repo, &url, &ssh, scheme);
        repos.push((repo, url));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let env = serve_env(
        &repos[0].1,
        &[
            ("GIT_SSH_COMMAND", &ssh),
            ("GITSTATE_ALLOWED_REPOSITORIES", &repos[1].1),
        ],
    );
    let serve = ServeProcess::start(Path::new(crate::GITSTATE), dir.path(), env).await;
    let client = Client::new(&serve.url);
    for (at, (repo, url)) in repos.iter().enumerate() {
        let seed =
            |repository: &str| format!("/?type=git&repository={repository}&state=ssh/app.tfstate");
        let raw = client.send("GET", &seed(url), None).await;
        assert_eq!(raw.status, 400, "{url}: {}", raw.body);
        assert!(raw.body.contains("git%2Bssh://"), "{}", raw.body);
        let address = seed(&url.replace('+', "%2B"));
        let read = client.send("GET", &address, None).await;
        assert_eq!(read.status, 200, "{url}: {}", read.body);
        let id = format!("seed-{at}");
        let lock = client.send("LOCK", &address, Some(&lock_info(&id))).await;
        assert_eq!(lock.status, 200, "{url}: {}", lock.body);
        let mut state: serde_json::Value = serde_json::from_str(&read.body).expect("a state");
        assert_eq!(state["serial"], 1, "{url}: Terraform's state, read back");
        state["serial"] = 2.into();
        let state = state.to_string();
        let wrote = client
            .send("POST", &format!("{address}&ID={id}"), Some(&state))
            .await;
        assert_eq!(wrote.status, 200, "{url}: {}", wrote.body);
        let unlock = client.send("UNLOCK", &address, Some(&lock_info(&id))).await;
        assert_eq!(unlock.status, 200, "{url}: {}", unlock.body);
        assert_eq!(
            serial(repo),
            2,
            "{url}: the write reached its own repository"
        );
    }
}

/// Eight `gitstate serve` processes over one SSH repository, six rounds: every round exactly one
/// wins the lock, the others see the winner's LockInfo (423), and the winner releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_race_for_one_lock_over_ssh() {
    const PROCESSES: usize = 8;
    const ROUNDS: usize = 6;
    let sshd = Sshd::start();
    let repo = sshd.bare_repo("race");
    let url = sshd.url(&repo, false);
    let ssh = sshd.ssh_command(false);
    let root = tempfile::tempdir().expect("tempdir");
    let mut procs = Vec::new();
    for i in 0..PROCESSES {
        let dir = root.path().join(format!("server-{i}"));
        std::fs::create_dir_all(&dir).expect("dir");
        let env = serve_env(&url, &[("GIT_SSH_COMMAND", &ssh), ("RUST_LOG", "info")]);
        procs.push(ServeProcess::start(Path::new(crate::GITSTATE), &dir, env).await);
    }
    let clients: Vec<Arc<Client>> = procs
        .iter()
        .map(|p| Arc::new(Client::new(&p.url)))
        .collect();
    let name = "shared/race.tfstate";
    for round in 0..ROUNDS {
        let mut tasks = Vec::new();
        for (i, client) in clients.iter().enumerate() {
            let client = client.clone();
            let id = format!("round{round}-p{i}");
            tasks.push(tokio::spawn(async move {
                let answer = client.lock(name, &id).await;
                (id, answer)
            }));
        }
        let mut winners = Vec::new();
        let mut holders = Vec::new();
        for task in tasks {
            let (id, answer) = task.await.expect("task");
            match answer.status {
                200 => winners.push(id),
                423 => {
                    let info: serde_json::Value =
                        serde_json::from_str(&answer.body).expect("holder's LockInfo");
                    holders.push(info["ID"].as_str().expect("ID").to_owned());
                }
                other => panic!("round {round}: {other} {}", answer.body),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        assert!(
            holders.iter().all(|h| *h == winners[0]),
            "round {round}: {holders:?}"
        );
        let winner: usize = winners[0]
            .rsplit('p')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("index");
        let unlock = clients[winner]
            .send(
                "DELETE",
                &format!("/locks/{name}"),
                Some(&lock_info(&winners[0])),
            )
            .await;
        assert_eq!(unlock.status, 200, "{}", unlock.body);
    }
}

/// terraform-backend-git's SSH variables as its users set them, with no `GIT_SSH_COMMAND`:
/// `SSH_PRIVATE_KEY` as the key's text (with line breaks, or flattened to `\n` as a CI secret
/// may carry it) or as a path, and `StrictHostKeyChecking=no` for a host never seen. Terraform
/// under `gitstate run` works over `ssh://`; `gitstate config` names the variables and never
/// shows the key; the key file is gone once the run ends; with `StrictHostKeyChecking=yes` the
/// unknown host stops the run, loudly.
#[test]
fn the_seeds_ssh_private_key_and_host_key_checking() {
    let sshd = Sshd::start();
    let repo = sshd.bare_repo("seed");
    let url = sshd.url(&repo, false);
    let key_path = sshd.dir.path().join("client_key");
    let key_text = std::fs::read_to_string(&key_path).expect("key");
    let body = key_text.lines().nth(1).expect("a key line").to_owned();
    let flat = key_text.trim_end().replace('\n', "\\n");
    let work = tempfile::tempdir().expect("tempdir");
    let temp = tempfile::tempdir().expect("tempdir for key files");
    std::fs::write(work.path().join("empty.tfrc"), "").expect("tfrc");
    std::fs::write(
        work.path().join("main.tf"),
        "resource \"terraform_data\" \"x\" {\n  input = \"seed ssh\"\n}\n",
    )
    .expect("main.tf");
    let gitstate = |env: &[(&str, &str)], args: &[&str]| -> (bool, String) {
        let out = Command::new(crate::GITSTATE)
            .args(args)
            .current_dir(work.path())
            .env_remove("GIT_SSH_COMMAND")
            .env_remove("GIT_SSH")
            .env_remove("SSH_AUTH_SOCK")
            .env("TMPDIR", temp.path())
            .env("TF_CLI_CONFIG_FILE", work.path().join("empty.tfrc"))
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_IN_AUTOMATION", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("gitstate");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let run = [
        "run",
        "--repository",
        &url,
        "--state",
        "ssh/app.tfstate",
        "--",
        "terraform",
    ];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        run.iter().copied().chain(extra.iter().copied()).collect()
    };
    let key_path_text = key_path.display().to_string();
    let no = ("StrictHostKeyChecking", "no");
    for (env, args) in [
        (
            [("SSH_PRIVATE_KEY", key_text.as_str()), no],
            with(&["init", "-input=false"]),
        ),
        (
            [("SSH_PRIVATE_KEY", flat.as_str()), no],
            with(&["apply", "-auto-approve", "-input=false"]),
        ),
        (
            [("SSH_PRIVATE_KEY", key_path_text.as_str()), no],
            with(&["plan", "-input=false", "-detailed-exitcode"]),
        ),
    ] {
        let (ok, out) = gitstate(&env, &args);
        assert!(ok, "{args:?}: {out}");
        assert!(!out.contains(&body), "the key was shown: {out}");
    }
    assert_eq!(serial(&repo), 1);
    // The ssh command made from the seed's variables is gitstate's own: the wrapped program
    // (and Terraform's own git fetches of modules) sees the user's ssh settings, not the key.
    let (ok, out) = gitstate(
        &[("SSH_PRIVATE_KEY", key_text.as_str()), no],
        &[
            "run",
            "--repository",
            &url,
            "--state",
            "ssh/app.tfstate",
            "--workdir",
            ".",
            "--",
            "printenv",
        ],
    );
    // The output is the environment, a token included: only names are printed.
    let names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(n, _)| n)
        .collect();
    assert!(
        ok && names.contains(&"TF_HTTP_ADDRESS"),
        "printenv did not run: {names:?}"
    );
    for leaked in ["GIT_SSH_COMMAND", "GITSTATE_SEED_SSH", "SSH_PRIVATE_KEY"] {
        assert!(
            !names.contains(&leaked),
            "{leaked} reached the wrapped program"
        );
    }
    let left: Vec<_> = std::fs::read_dir(temp.path())
        .expect("temp")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "key files left behind: {left:?}");

    // An SSH_PRIVATE_KEY that is neither a key nor a file (another tool's) stops only the
    // commands that reach the repository, naming the variable.
    let unrelated = [("SSH_PRIVATE_KEY", "c29tZSBiYXNlNjQ="), no];
    for args in [
        &["--help"][..],
        &["encrypt", "--help"],
        &["list", "--url", "http://127.0.0.1:9"],
    ] {
        let (_, out) = gitstate(&unrelated, args);
        assert!(!out.contains("SSH_PRIVATE_KEY"), "{args:?}: {out}");
    }
    let (ok, out) = gitstate(&unrelated, &["config", "--repository", &url]);
    assert!(!ok && out.contains("SSH_PRIVATE_KEY"), "{out}");

    let (ok, out) = gitstate(
        &[("SSH_PRIVATE_KEY", key_text.as_str()), no],
        &["config", "--repository", &url],
    );
    assert!(ok, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("GIT_SSH_COMMAND"))
        .unwrap_or_else(|| panic!("no ssh line: {out}"));
    assert!(
        line.contains("env SSH_PRIVATE_KEY, StrictHostKeyChecking (terraform-backend-git)")
            && line.contains("StrictHostKeyChecking=no"),
        "{line}"
    );
    assert!(!out.contains(&body), "config showed the key: {out}");

    let (ok, out) = gitstate(
        &[
            ("SSH_PRIVATE_KEY", key_text.as_str()),
            ("StrictHostKeyChecking", "yes"),
        ],
        &with(&["plan", "-input=false"]),
    );
    assert!(!ok, "an unknown host key must stop the run: {out}");
    assert!(out.contains("Host key verification failed"), "{out}");
    assert!(!out.contains(&body), "the key was shown: {out}");
}

/// `gitstate fold` over SSH (both URL forms, a fresh cache each): generated writes on two
/// states' refs reach the branch once each, and the record names the last of each.
#[test]
fn gitstate_fold_over_ssh() {
    use gitstate_tests::handmade::{Bare, Stamp, StateWrite};
    use rand::{Rng, SeedableRng};
    let sshd = Sshd::start();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x55f0);
    for (form, with_port) in [("fold-url", false), ("fold-scp", true)] {
        let repo = sshd.bare_repo(form);
        let url = sshd.url(&repo, with_port);
        let bare = Bare::new(&repo, "main");
        let stamp = |at: i64| Stamp {
            name: "ann".into(),
            email: "ann@example.invalid".into(),
            date: format!("{} +0000", 1_700_000_000 + at),
        };
        let write = |path: &str, at: i64, message: String| StateWrite {
            path: path.to_owned(),
            content: format!("{{\"serial\":{at}}}\n").into_bytes(),
            author: stamp(at),
            committer: stamp(at),
            message,
        };
        let paths = ["a.tfstate", "team/b.tfstate"];
        for path in paths {
            bare.branch_write(
                path,
                Some(b"{}\n"),
                &write(path, 1, format!("create {path}\n")),
            );
        }
        let mut last = std::collections::BTreeMap::new();
        let writes = rng.random_range(2..7);
        for at in 0..writes {
            let path = paths[rng.random_range(0..2)];
            let id = bare.state_write(&write(
                path,
                10 + at,
                format!("write {path}\n\nUser: ann\n"),
            ));
            last.insert(path, id);
        }
        let work = tempfile::tempdir().expect("tempdir");
        let out = Command::new(crate::GITSTATE)
            .args(["fold", "--repository", &url])
            .env("GIT_SSH_COMMAND", sshd.ssh_command(with_port))
            .env("GITSTATE_CACHE_DIR", work.path().join("cache"))
            .env("HOME", work.path())
            .output()
            .expect("gitstate fold");
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{form}: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            said.contains(&format!(
                "folded {writes} write(s) of {} state(s)",
                last.len()
            )),
            "{form}: {said}"
        );
        let record = bare.folded();
        for (path, id) in &last {
            assert_eq!(record.get(*path), Some(id), "{form}: {path}");
        }
    }
}

/// The wrapper's start-up look is the one a push begins with: over SSH, a key that may only read
/// (receive-pack refused, as a read-only deploy key) still runs `plan -lock=false`, with a
/// warning that names the refusal. (A run that takes up the last clean run's note makes no
/// look: its plan reads all the same.)
#[test]
fn gitstate_run_with_a_key_that_may_only_read_still_plans_without_a_lock() {
    let sshd = Sshd::start();
    let repo = sshd.bare_repo("ro");
    let url = sshd.url(&repo, false);
    let ssh = sshd.ssh_command(false);
    let work = apply_once(&repo, &url, &ssh, "ro");
    let d = sshd.dir.path();
    let script = d.join("ro.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\ncase \"$SSH_ORIGINAL_COMMAND\" in\n  git-receive-pack*) echo 'ERROR: this key may only read' >&2; exit 1;;\nesac\nexec sh -c \"$SSH_ORIGINAL_COMMAND\"\n",
    )
    .expect("script");
    Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .expect("chmod");
    let key = std::fs::read_to_string(d.join("client_key.pub")).expect("key");
    std::fs::write(
        d.join("authorized_keys"),
        format!("command=\"{}\" {key}", script.display()),
    )
    .expect("authorized");
    let plan = ["plan", "-lock=false", "-input=false", "-detailed-exitcode"];
    let (ok, out) = terraform_run(work.path(), &url, &ssh, &plan);
    assert!(ok, "a plan without a lock after a clean run: {out}");
    assert!(!out.contains("may only read"), "no look, no warning: {out}");
    let note = notes(work.path());
    assert_eq!(note.len(), 1, "the clean runs' note: {note:?}");
    std::fs::remove_file(&note[0]).expect("remove the note");
    let (ok, out) = terraform_run(work.path(), &url, &ssh, &plan);
    eprintln!("{out}");
    assert!(ok, "a plan without a lock with a read-only key: {out}");
    assert!(
        out.contains("may only read"),
        "the warning names the refusal: {out}"
    );
}

/// The session notes the wrapper's runs left under `dir`.
fn notes(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path
                .file_name()
                .is_some_and(|n| n == "gitstate-session.json")
            {
                found.push(path);
            }
        }
    }
    found
}
