//! Issue 23, the server's half: every misconfigured address or request fails loudly, with a reason,
//! and Terraform (the real terraform and OpenTofu) fails on it instead of acting on a wrong
//! picture of the state. The inputs are generated; each run prints its seed
//! (`GITSTATE_TEST_SEED=<n>` replays one) and drives a bounded sample of them through the clients.

use std::path::Path;

use gitstate_tests::{Client, GitServer, TestBackend, init_tracing};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};

use crate::terraform::{Cli, terraform_binary, tofu_binary, transcript};

const NAME: &str = "env/prod.tfstate";

/// The seed of this run: `GITSTATE_TEST_SEED`, or the clock; printed so a failure can be replayed.
pub(crate) fn seed(test: &str) -> u64 {
    let seed = std::env::var("GITSTATE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    eprintln!("{test}: GITSTATE_TEST_SEED={seed}");
    seed
}

/// The route words of the API; a near miss is none of them.
const ROUTE_WORDS: [&str; 7] = ["states", "locks", "history", "health", "ui", "", "."];

/// `word` with one or two random edits: a letter dropped, added, changed, two swapped, or the
/// case of one flipped.
fn near_miss(rng: &mut StdRng, word: &str) -> String {
    let mut chars: Vec<char> = word.chars().collect();
    for _ in 0..rng.random_range(1..=2) {
        let len = chars.len();
        let at = rng.random_range(0..len.max(1));
        let letter = rng.random_range('a'..='z');
        match rng.random_range(0..5) {
            0 if len > 1 => {
                chars.remove(at.min(len - 1));
            }
            1 => chars.insert(at.min(len), letter),
            2 if len > 0 => chars[at.min(len - 1)] = letter,
            3 if len > 1 => chars.swap(at.min(len - 2), at.min(len - 2) + 1),
            _ if len > 0 => {
                let i = at.min(len - 1);
                chars[i] = if chars[i].is_ascii_lowercase() {
                    chars[i].to_ascii_uppercase()
                } else {
                    chars[i].to_ascii_lowercase()
                };
            }
            _ => chars.push(letter),
        }
    }
    chars.into_iter().collect()
}

fn word(rng: &mut StdRng) -> String {
    (0..rng.random_range(1..8))
        .map(|_| rng.random_range('a'..='z'))
        .collect()
}

/// The seed tool's address of [`NAME`] on `repository`, parameters in a random order.
fn seed_params(rng: &mut StdRng, repository: &str) -> Vec<(String, String)> {
    let mut params = vec![
        ("type".to_owned(), "git".to_owned()),
        ("repository".to_owned(), repository.to_owned()),
        ("ref".to_owned(), "main".to_owned()),
        ("state".to_owned(), NAME.to_owned()),
    ];
    for i in (1..params.len()).rev() {
        params.swap(i, rng.random_range(0..=i));
    }
    params
}

fn query(params: &[(String, String)]) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in params {
        out.append_pair(k, v);
    }
    out.finish()
}

/// A generated address (path and query) that must never read as "no state", and its class.
fn misaddressed(rng: &mut StdRng, repository: &str) -> (&'static str, String) {
    match rng.random_range(0..7) {
        0 => {
            let route = ["states", "locks", "history"][rng.random_range(0..3)];
            let word = loop {
                let candidate = near_miss(rng, route);
                if !ROUTE_WORDS.contains(&candidate.as_str()) {
                    break candidate;
                }
            };
            ("near-miss route", format!("/{word}/{NAME}"))
        }
        1 => {
            // A word that is a route itself (`/ui/states/<name>`, the console's page of a
            // state, which must look in git) makes no misaddressed route.
            let word = loop {
                let candidate = word(rng);
                if !ROUTE_WORDS.contains(&candidate.as_str()) {
                    break candidate;
                }
            };
            let path = match rng.random_range(0..5) {
                0 => format!("/{NAME}"),
                1 => "/prod.tfstate".to_owned(),
                2 => format!("/{word}/states/{NAME}"),
                3 => format!("/states{word}/{NAME}"),
                _ => format!("/{word}/{NAME}"),
            };
            ("no route", path)
        }
        2 => {
            // The seed format without one of the parameters it needs (`ref` may be left out).
            let mut params = seed_params(rng, repository);
            let needed = ["type", "repository", "state"][rng.random_range(0..3)];
            params.retain(|(k, _)| k != needed);
            if rng.random_bool(0.5) {
                params.retain(|(k, _)| k != "ref");
            }
            (
                "seed format, a parameter missing",
                format!("/?{}", query(&params)),
            )
        }
        3 => {
            // The seed format with one parameter's name misspelt.
            let mut params = seed_params(rng, repository);
            let i = rng.random_range(0..params.len());
            let original = params[i].0.clone();
            params[i].0 = loop {
                let candidate = near_miss(rng, &original);
                if !["type", "repository", "ref", "state", "ID"].contains(&candidate.as_str()) {
                    break candidate;
                }
            };
            (
                "seed format, a name misspelt",
                format!("/?{}", query(&params)),
            )
        }
        4 => {
            // A parameter the state's address does not take.
            let key = loop {
                let candidate = if rng.random_bool(0.5) {
                    let known = ["ref", "ID", "repository"][rng.random_range(0..3)];
                    near_miss(rng, known)
                } else {
                    word(rng)
                };
                if !["ref", "ID", "repository"].contains(&candidate.as_str()) {
                    break candidate;
                }
            };
            let params = [(key, word(rng))];
            (
                "unknown parameter",
                format!("/states/{NAME}?{}", query(&params)),
            )
        }
        5 => {
            // A parameter without a value.
            let key = ["ref", "repository", "ID"][rng.random_range(0..3)];
            ("empty parameter", format!("/states/{NAME}?{key}="))
        }
        _ => {
            // A name the rules refuse.
            let name = match rng.random_range(0..6) {
                0 => format!("{NAME}/"),
                1 => NAME.replace('/', "//"),
                2 => format!(".git/{NAME}"),
                3 => format!(".gitstate/{}", word(rng)),
                4 => format!("{NAME}.lock"),
                _ => format!("env/%20{}", word(rng)),
            };
            ("refused name", format!("/states/{name}"))
        }
    }
}

/// A backend block whose state address is `address`; the lock addresses are right, so only the
/// state's address is wrong.
fn config(base: &str, address: &str) -> String {
    format!(
        r#"terraform {{
  backend "http" {{
    address        = "{base}{address}"
    lock_address   = "{base}/locks/{NAME}"
    unlock_address = "{base}/locks/{NAME}"
    lock_method    = "POST"
    unlock_method  = "DELETE"
    retry_max      = 0
  }}
}}
"#
    )
}

/// `terraform init` on `address`: its exit status and transcript.
async fn init(cli: &Cli, base: &str, address: &str) -> (bool, String) {
    let work = tempfile::tempdir().expect("tempdir");
    let dir: &Path = work.path();
    std::fs::write(dir.join("main.tf"), config(base, address)).expect("main.tf");
    let out = cli.run(dir, &["init", "-no-color", "-input=false"]).await;
    (out.status.success(), transcript(&out))
}

/// Generated addresses with a typo in the route, the seed format missing a parameter, an unknown,
/// misspelt or empty query parameter, or a refused name: every one is a 400 with a one-line
/// reason (never the 404 Terraform reads as "no state"), nothing reaches git; and terraform and
/// OpenTofu fail `init` on a sample of them, while the right address inits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misaddressed_requests_fail_and_terraform_fails_on_them() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    let mut rng = StdRng::seed_from_u64(seed("misaddressed"));

    // The control: the right address is "no state" (404), which the generated ones never are.
    client.get_state(NAME).await.expect(404);
    server.take_requests();
    let mut cases = Vec::new();
    for _ in 0..300 {
        let (class, address) = misaddressed(&mut rng, &url);
        let answer = client.send("GET", &address, None).await;
        assert_eq!(
            answer.status, 400,
            "{class}: GET {address}: {}",
            answer.body
        );
        let reason = answer.body.trim();
        assert!(
            !reason.is_empty() && !reason.contains('\n'),
            "{class}: GET {address}: one line: {reason:?}"
        );
        let reached = server.take_requests();
        assert!(
            reached.is_empty(),
            "{class}: GET {address} ({reason}) is refused but reached git: {reached:?}"
        );
        cases.push((class, address));
    }

    // terraform and OpenTofu, on a sample: init fails, saying the status.
    let clis = [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ];
    for (label, cli) in &clis {
        let (ok, text) = init(cli, &backend.url, &format!("/states/{NAME}")).await;
        assert!(ok, "{label}: the right address inits:\n{text}");
    }
    let per_client = 25;
    for (label, cli) in &clis {
        for _ in 0..per_client {
            let (class, address) = &cases[rng.random_range(0..cases.len())];
            let (ok, text) = init(cli, &backend.url, address).await;
            assert!(!ok, "{label} init must fail on {class} {address}:\n{text}");
            assert!(
                text.contains("400"),
                "{label}: {class} {address}: the status is shown:\n{text}"
            );
        }
    }
    eprintln!(
        "misaddressed: {} generated addresses over HTTP, {} terraform/tofu runs",
        cases.len(),
        per_client * clis.len()
    );
}

/// gitstate's other GET addresses of a state, exactly as they are spelt, for states that exist
/// and states that do not: the lock's address while nobody holds it (409), an unknown revision at
/// `/history/<name>?at=` by serial or by commit id (400), `?at=` on a state's address (400); and,
/// answered 200 with JSON that is not a state, the lock's address while it is held and the
/// history's list. None answers 404 or 204 (Terraform's "no state"), the refusals are one line
/// naming the state's address, and terraform and OpenTofu fail `init` on every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_history_addresses_are_never_no_state() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    let mut rng = StdRng::seed_from_u64(seed("lock and history addresses"));
    let hex = |rng: &mut StdRng| -> String {
        (0..40)
            .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
            .collect()
    };
    // (class, address, the status it must answer)
    let mut cases: Vec<(&str, String, u16)> = Vec::new();
    let (mut existing, mut missing) = (0, 0);
    for i in 0..6 {
        let name = format!("{}{i}/{}.tfstate", word(&mut rng), word(&mut rng));
        let serials = if i % 2 == 0 {
            rng.random_range(1..=3)
        } else {
            0
        };
        for serial in 1..=serials {
            let state = gitstate_tests::state_json("gen", serial);
            client.apply(&name, "setup", &state).await;
        }
        if serials > 0 {
            existing += 1;
            if rng.random_bool(0.5) {
                client.lock(&name, "held").await.expect(200);
                cases.push(("the lock's address, held", format!("/locks/{name}"), 200));
            } else {
                cases.push(("the lock's address, free", format!("/locks/{name}"), 409));
            }
            cases.push(("the history's list", format!("/history/{name}"), 200));
        } else {
            missing += 1;
            cases.push(("the lock's address, free", format!("/locks/{name}"), 409));
        }
        let unknown = serials + rng.random_range(1..1000);
        cases.push((
            "an unknown serial at /history/",
            format!("/history/{name}?at={unknown}"),
            400,
        ));
        cases.push((
            "an unknown commit at /history/",
            format!("/history/{name}?at={}", hex(&mut rng)),
            400,
        ));
        let at = if rng.random_bool(0.5) {
            rng.random_range(1..=serials.max(1)).to_string()
        } else {
            hex(&mut rng)
        };
        cases.push(("?at= at /states/", format!("/states/{name}?at={at}"), 400));
    }
    for (class, address, status) in &cases {
        let answer = client.send("GET", address, None).await;
        assert_eq!(
            answer.status, *status,
            "{class}: GET {address}: {}",
            answer.body
        );
        if *status != 200 {
            let reason = answer.body.trim();
            assert!(
                !reason.is_empty() && !reason.contains('\n'),
                "{class}: GET {address}: one line: {reason:?}"
            );
            if !address.starts_with("/states/") {
                assert!(
                    reason.contains("/states/<name>"),
                    "{class}: GET {address}: names the state's address: {reason}"
                );
            }
        }
    }

    let clis = [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ];
    let mut runs = 0;
    for (label, cli) in &clis {
        for (class, address, status) in &cases {
            let (ok, text) = init(cli, &backend.url, address).await;
            runs += 1;
            assert!(!ok, "{label} init must fail on {class} {address}:\n{text}");
            if *status != 200 {
                assert!(
                    text.contains(&status.to_string()),
                    "{label}: {class} {address}: the status is shown:\n{text}"
                );
            }
        }
    }
    eprintln!(
        "lock and history addresses: {} generated addresses of {existing} existing and {missing} \
         missing states, {runs} terraform/tofu init runs",
        cases.len()
    );
}

const ONE_RESOURCE: &str = r#"
resource "terraform_data" "item" {
  input = "x"
}
"#;

/// A backend block with the given lock address (a path on `base`) and methods.
fn lock_config(base: &str, lock_path: &str, lock_method: &str, unlock_method: &str) -> String {
    format!(
        r#"terraform {{
  backend "http" {{
    address        = "{base}/states/{NAME}"
    lock_address   = "{base}{lock_path}"
    unlock_address = "{base}{lock_path}"
    lock_method    = "{lock_method}"
    unlock_method  = "{unlock_method}"
    retry_max      = 0
  }}
}}
{ONE_RESOURCE}"#
    )
}

/// Lock requests sent to the state's address, as terraform and OpenTofu send them with
/// `lock_address` = the state's address: with `lock_method = "POST"` the apply fails and the
/// stored state is byte for byte what it was (before, the LockInfo replaced it); with
/// `unlock_method = "DELETE"` it fails and the state is still there (before, the DELETE removed
/// it; the apply's own write under its LOCK lands); with LOCK/UNLOCK there (gitstate's verbs on a
/// state's address) or the lock's own address it applies. Every combination of lock address and
/// methods, for both clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_requests_at_the_state_address_never_touch_the_state() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    let state = gitstate_tests::state_json("L", 1);
    client.apply(NAME, "setup", &state).await;
    let clis = [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ];
    let mut runs = 0;
    for (label, cli) in &clis {
        for lock_path in [format!("/states/{NAME}"), format!("/locks/{NAME}")] {
            for (lock_method, unlock_method) in [
                ("POST", "DELETE"),
                ("POST", "UNLOCK"),
                ("LOCK", "DELETE"),
                ("LOCK", "UNLOCK"),
            ] {
                let at_state = lock_path.starts_with("/states/");
                let misdirected = at_state && (lock_method == "POST" || unlock_method == "DELETE");
                let before = client.get_state(NAME).await.expect(200).body;
                let work = tempfile::tempdir().expect("tempdir");
                let dir = work.path();
                std::fs::write(
                    dir.join("main.tf"),
                    lock_config(&backend.url, &lock_path, lock_method, unlock_method),
                )
                .expect("main.tf");
                cli.ok(dir, &["init", "-no-color", "-input=false"]).await;
                let out = cli
                    .run(
                        dir,
                        &["apply", "-auto-approve", "-no-color", "-input=false"],
                    )
                    .await;
                runs += 2;
                let text = transcript(&out);
                let case = format!("{label} lock at {lock_path} {lock_method}/{unlock_method}");
                if misdirected {
                    assert!(!out.status.success(), "{case} must fail:\n{text}");
                    let after = client.get_state(NAME).await.expect(200);
                    if lock_method == "POST" {
                        assert_eq!(after.body, before, "{case}: the state is untouched");
                    } else {
                        // Locked by LOCK, the write under it is Terraform's own; the unlock sent
                        // as a DELETE to the state did not remove it.
                        assert!(after.state().serial >= 1, "{case}: {}", after.body);
                    }
                } else {
                    assert!(out.status.success(), "{case}:\n{text}");
                }
                // Whatever lock a failed run left is released for the next combination.
                client.force_unlock(NAME).await;
            }
        }
    }
    eprintln!("lock requests at the state address: {runs} terraform/tofu runs");
}

/// A stored file that is not a state (empty, blank, not JSON, a JSON array or string, generated
/// bytes) is an error for terraform and OpenTofu, never "no state": `plan` fails instead of
/// planning to create the resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_file_that_is_not_a_state_fails_the_plan() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    let mut rng = StdRng::seed_from_u64(seed("not a state"));
    let clis = [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ];
    let mut runs = 0;
    for round in 0..6 {
        let content: Vec<u8> = match round {
            0 => Vec::new(),
            1 => b" \n\t\n".to_vec(),
            2 => b"[1, 2]".to_vec(),
            3 => b"\"a string\"".to_vec(),
            _ => (0..rng.random_range(1..200))
                .map(|_| rng.random_range(0x20u8..0x7f))
                .filter(|b| *b != b'{')
                .collect(),
        };
        let name = format!("broken/{round}.tfstate");
        gitstate_tests::commit_file(&server, "infra", &name, &content);
        let answer = client.get_state(&name).await;
        assert!(
            answer.status >= 400 && answer.status != 404,
            "{content:?}: {}",
            answer.status
        );
        for (label, cli) in &clis {
            let work = tempfile::tempdir().expect("tempdir");
            let dir = work.path();
            let block = config(&backend.url, &format!("/states/{name}"));
            std::fs::write(dir.join("main.tf"), format!("{block}{ONE_RESOURCE}")).expect("main.tf");
            let init = cli.run(dir, &["init", "-no-color", "-input=false"]).await;
            let plan = cli
                .run(dir, &["plan", "-no-color", "-input=false", "-lock=false"])
                .await;
            runs += 2;
            let text = format!("{}{}", transcript(&init), transcript(&plan));
            assert!(
                !init.status.success() || !plan.status.success(),
                "{label} must fail on {content:?}:\n{text}"
            );
            assert!(
                !text.contains("to add"),
                "{label} planned against no state:\n{text}"
            );
        }
    }
    eprintln!("not a state: {runs} terraform/tofu runs");
}

/// Generated states in folders (`a/b/c.tfstate`, `a/b.tfstate`, `d`), written through one backend:
/// every folder that holds one (`a`, `a/b`) and every name below one (`d/x`) is a 409 naming
/// the state in the way on GET, through the writing backend and a cold one, never the 404
/// Terraform reads as "no state"; a name that is neither is 404 (the control). terraform and
/// OpenTofu pointed at a folder fail `plan -lock=false` instead of planning to create it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_of_states_is_never_no_state() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let writer = TestBackend::start(&url, &[]).await;
    let cold = TestBackend::start(&url, &[]).await;
    let mut rng = StdRng::seed_from_u64(seed("folders"));
    let mut states: Vec<String> = Vec::new();
    while states.len() < 4 {
        let depth = rng.random_range(1..=3);
        let mut segments: Vec<String> = (0..depth).map(|_| word(&mut rng)).collect();
        if rng.random_bool(0.5)
            && let Some(last) = segments.last_mut()
        {
            last.push_str(".tfstate");
        }
        let name = segments.join("/");
        let related = |other: &String| {
            *other == name
                || other.starts_with(&format!("{name}/"))
                || name.starts_with(&format!("{other}/"))
        };
        if !states.iter().any(related) {
            let state = gitstate_tests::state_json(&word(&mut rng), 1);
            Client::new(&writer.url).apply(&name, "setup", &state).await;
            states.push(name);
        }
    }
    let mut cases = Vec::new();
    for state in &states {
        let segments: Vec<&str> = state.split('/').collect();
        for end in 1..segments.len() {
            cases.push((segments[..end].join("/"), "a folder holding the state"));
        }
        cases.push((format!("{state}/{}", word(&mut rng)), "below the state"));
    }
    for backend in [&writer, &cold] {
        let client = Client::new(&backend.url);
        for (name, why) in &cases {
            let answer = client.get_state(name).await;
            assert_eq!(answer.status, 409, "GET {name}: {}", answer.body);
            assert!(
                answer.body.contains(why) && states.iter().any(|s| answer.body.contains(s)),
                "GET {name}: the reason names the state in the way: {}",
                answer.body
            );
        }
        client.get_state("absent/neither.tfstate").await.expect(404);
    }

    let (folder, _) = &cases[rng.random_range(0..cases.len())];
    for (label, cli) in [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ] {
        let work = tempfile::tempdir().expect("tempdir");
        let dir = work.path();
        let block = config(&cold.url, &format!("/states/{folder}"));
        std::fs::write(dir.join("main.tf"), format!("{block}{ONE_RESOURCE}")).expect("main.tf");
        let init = cli.run(dir, &["init", "-no-color", "-input=false"]).await;
        let plan = cli
            .run(dir, &["plan", "-no-color", "-input=false", "-lock=false"])
            .await;
        let text = format!("{}{}", transcript(&init), transcript(&plan));
        assert!(
            !init.status.success() || !plan.status.success(),
            "{label} must fail on the folder {folder}:\n{text}"
        );
        assert!(
            text.contains("409"),
            "{label}: the status is shown:\n{text}"
        );
        assert!(
            !text.contains("to add"),
            "{label} planned against no state:\n{text}"
        );
    }
    eprintln!(
        "folders: {} states, {} folder or below names",
        states.len(),
        cases.len()
    );
}

/// A state's path the repository holds as something other than a file, committed behind the
/// backend's back: a symbolic link (a person aliasing `env/prod.tfstate` to another state) or a
/// submodule. Neither is "no state" (404, which Terraform plans against): each is a 500 whose
/// log names the path and what it is, and terraform and OpenTofu fail `plan -lock=false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_path_that_is_no_file_is_never_no_state() {
    init_tracing();
    gitstate_tests::capture_logs();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    let mut rng = StdRng::seed_from_u64(seed("no file"));
    let real = format!("env/{}.tfstate", word(&mut rng));
    client
        .apply(&real, "setup", &gitstate_tests::state_json("L", 1))
        .await;
    let work = tempfile::tempdir().expect("tempdir");
    let clone = work.path().join("clone");
    let clone_str = clone.to_str().expect("utf-8");
    let git = |args: &[&str]| gitstate_tests::git(args, Some(&clone));
    gitstate_tests::git(
        &[
            "clone",
            "-q",
            &server.url_with_credentials("infra"),
            clone_str,
        ],
        None,
    );
    let link = format!("env/link-{}.tfstate", word(&mut rng));
    let target = real.trim_start_matches("env/");
    std::os::unix::fs::symlink(target, clone.join(&link)).expect("symlink");
    git(&["add", &link]);
    let head = git(&["rev-parse", "HEAD"]);
    let module = format!("env/module-{}.tfstate", word(&mut rng));
    git(&[
        "update-index",
        "--add",
        "--cacheinfo",
        &format!("160000,{},{module}", head.trim()),
    ]);
    git(&[
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "-m",
        "not files",
    ]);
    git(&["push", "-q", "origin", "HEAD:main"]);

    for (name, what) in [(&link, "symbolic link"), (&module, "submodule")] {
        let answer = client.get_state(name).await;
        assert_eq!(answer.status, 500, "GET {name}: {}", answer.body);
        let logs = gitstate_tests::captured_logs();
        assert!(
            logs.lines()
                .any(|l| l.contains(name.as_str()) && l.contains(what)),
            "GET {name}: the log names the path and the {what}"
        );
    }
    client.get_state(&real).await.expect(200);
    for (label, cli) in [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let block = config(&backend.url, &format!("/states/{link}"));
        std::fs::write(dir.path().join("main.tf"), format!("{block}{ONE_RESOURCE}"))
            .expect("main.tf");
        let init = cli
            .run(dir.path(), &["init", "-no-color", "-input=false"])
            .await;
        let plan = cli
            .run(
                dir.path(),
                &["plan", "-no-color", "-input=false", "-lock=false"],
            )
            .await;
        let text = format!("{}{}", transcript(&init), transcript(&plan));
        assert!(
            !init.status.success() || !plan.status.success(),
            "{label} must fail on the link {link}:\n{text}"
        );
        assert!(
            !text.contains("to add"),
            "{label} planned against no state:\n{text}"
        );
    }
}

/// terraform-backend-git's address format without `ref=`, kept in a backend block from the seed
/// tool's days, meant its default branch `master`. Served by a gitstate configured with its own
/// names (`GITSTATE_REPOSITORY`, so `GITSTATE_REF` defaults to `main`) on a repository that has
/// both, the states on `master` and other content on `main`, the same address reads `main` and
/// answered 404: Terraform planned to create every resource the seed's state holds. Now such a
/// read fails naming `master`; a name `master` lacks too is still "no state", and an address
/// that names `main` is refused too while `main` keeps no states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_address_without_ref_never_reads_another_branch_as_no_state() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let work = tempfile::tempdir().expect("tempdir");
    let clone = work.path().join("clone");
    let git = |args: &[&str]| gitstate_tests::git(args, Some(&clone));
    gitstate_tests::git(
        &[
            "clone",
            "-q",
            &server.url_with_credentials("infra"),
            clone.to_str().expect("utf-8"),
        ],
        None,
    );
    let commit = |path: &str, content: &str, branch: &str| {
        let file = clone.join(path);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("dirs");
        std::fs::write(&file, content).expect("write");
        git(&["add", path]);
        git(&[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            path,
        ]);
        git(&["push", "-q", "origin", &format!("HEAD:{branch}")]);
    };
    commit(
        "my/state.json",
        &gitstate_tests::state_json("seed", 7),
        "master",
    );
    git(&["checkout", "-q", "--orphan", "other"]);
    git(&["rm", "-q", "-r", "-f", "."]);
    commit("README.md", "states live on master\n", "main");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    let with_ref = format!(
        "/?{}",
        query(&[
            ("type".into(), "git".into()),
            ("repository".into(), url.clone()),
            ("ref".into(), "master".into()),
            ("state".into(), "my/state.json".into()),
        ])
    );
    let seeded = client.send("GET", &with_ref, None).await;
    assert_eq!(
        seeded.status, 403,
        "master is not allowlisted here: {}",
        seeded.body
    );
    let without_ref = format!(
        "/?{}",
        query(&[
            ("type".into(), "git".into()),
            ("repository".into(), url.clone()),
            ("state".into(), "my/state.json".into()),
        ])
    );
    let answer = client.send("GET", &without_ref, None).await;
    assert_eq!(
        answer.status, 400,
        "the seed's state on master must not read as no state: {}",
        answer.body
    );
    assert!(
        answer.body.contains("\"master\"") && answer.body.contains("ref=master"),
        "the reason names the branch and the fix: {}",
        answer.body
    );
    let seed_address = |state: &str, branch: Option<&str>| {
        let mut params = vec![
            ("type".into(), "git".into()),
            ("repository".into(), url.clone()),
            ("state".into(), state.into()),
        ];
        params.extend(branch.map(|b| ("ref".into(), b.into())));
        format!("/?{}", query(&params))
    };
    let elsewhere = client
        .send("GET", &seed_address("my/other.json", None), None)
        .await;
    assert_eq!(
        elsewhere.status, 404,
        "on neither branch: {}",
        elsewhere.body
    );
    let named = client
        .send("GET", &seed_address("my/state.json", Some("main")), None)
        .await;
    // Naming `main` reads `main`, which keeps no states while `master` keeps this one: not
    // "no state" either.
    assert_eq!(named.status, 400, "ref=main, beside master: {}", named.body);
    assert!(
        named.body.contains("\"master\"") && named.body.contains("index.json"),
        "the reason names the branch and the way to start states on main: {}",
        named.body
    );
}

/// A near name of a stored state (`Network/Prod.tfstate`, `network/prod`,
/// `network/prod.tfstate.tfstate` or `network/prod.json` beside `network/prod.tfstate`: a typo in
/// the backend block) read as "no state" (404) and its LOCK was granted, so Terraform planned to
/// create every resource again and the apply started a second state beside the first (one that a
/// checkout on macOS or Windows cannot even hold, for a case variant). Each is refused, 409
/// naming the stored state, on GET and LOCK; the stored names themselves still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_near_name_of_a_state_is_never_no_state() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    let mut rng = StdRng::seed_from_u64(seed("near names"));
    let endings = [
        "",
        ".tfstate",
        ".json",
        ".tfstate.tfstate",
        ".TFSTATE",
        ".json.tfstate",
    ];
    let mut stored = Vec::new();
    for (n, ending) in [".tfstate", ".json", ""].into_iter().enumerate() {
        let name = format!("{}{n}/{}{ending}", word(&mut rng), word(&mut rng));
        client
            .apply(&name, "setup", &gitstate_tests::state_json("L", 1))
            .await;
        stored.push(name);
    }
    let mut refused = 0;
    for _ in 0..24 {
        let name = stored.choose(&mut rng).expect("stored");
        let (folder, file) = name.rsplit_once('/').expect("folder");
        let stem = gitstate_core::refs::file_stem(file);
        let slip: String = format!(
            "{folder}/{stem}{}",
            endings.choose(&mut rng).expect("ending")
        )
        .chars()
        .map(|c| match rng.random_bool(0.3) {
            true => c.to_ascii_uppercase(),
            false => c,
        })
        .collect();
        if stored.contains(&slip) {
            let read = client.get_state(&slip).await;
            assert_eq!(read.status, 200, "GET {slip}: {}", read.body);
            continue;
        }
        refused += 1;
        let read = client.get_state(&slip).await;
        assert_eq!(read.status, 409, "GET {slip}: {}", read.body);
        assert!(
            read.body.contains(name.as_str()),
            "GET {slip}: {}",
            read.body
        );
        let lock = client.lock(&slip, "typo").await;
        assert_eq!(lock.status, 409, "LOCK {slip}: {}", lock.body);
    }
    assert!(refused > 0);
    // A name near none of them is a new state, as ever.
    let new = format!("{}/fresh.tfstate", word(&mut rng));
    assert_eq!(client.get_state(&new).await.status, 404);
}

/// How a generated backend block leaves out the lock, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Locking {
    /// No `lock_address` and no `unlock_address`: Terraform never locks.
    NoAddresses,
    /// Only `unlock_address`: still no lock taken.
    UnlockOnly,
    /// Both addresses, but `apply -lock=false`.
    LockFalse,
    /// Both addresses and a locked apply: the control.
    Locked,
}

/// A backend block for `name` with the lock addresses `locking` gives it, and one resource whose
/// input is `input` (a new input makes the apply write the state).
fn locking_config(base: &str, name: &str, locking: Locking, input: &str) -> String {
    let lock =
        format!("    lock_address   = \"{base}/locks/{name}\"\n    lock_method    = \"POST\"\n");
    let unlock =
        format!("    unlock_address = \"{base}/locks/{name}\"\n    unlock_method  = \"DELETE\"\n");
    let (lock, unlock) = match locking {
        Locking::NoAddresses => (String::new(), String::new()),
        Locking::UnlockOnly => (String::new(), unlock),
        Locking::LockFalse | Locking::Locked => (lock, unlock),
    };
    format!(
        r#"terraform {{
  backend "http" {{
    address        = "{base}/states/{name}"
{lock}{unlock}    retry_max      = 0
  }}
}}

resource "terraform_data" "item" {{
  input = "{input}"
}}
"#
    )
}

/// Writes without a lock are refused by default: generated backend blocks without
/// `lock_address` (or with only `unlock_address`), and `apply -lock=false`, for terraform and
/// OpenTofu, over a new or an existing state. Against a backend with the default settings the
/// apply fails with 428 and the repository holds what it held (nothing written, no new state);
/// against one with `GITSTATE_ALLOW_UNLOCKED_WRITES=true` it applies and the backend logs a
/// warning naming the state. A locked apply (the control) works on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_without_a_lock_are_refused_by_default() {
    init_tracing();
    gitstate_tests::capture_logs();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let strict = TestBackend::start(&url, &[(gitstate_tests::UNLOCKED_WRITES, "false")]).await;
    let lenient = TestBackend::start(&url, &[(gitstate_tests::UNLOCKED_WRITES, "true")]).await;
    let reader = Client::new(&lenient.url);
    let mut rng = StdRng::seed_from_u64(seed("unlocked writes"));
    let clis = [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ];
    let (mut runs, mut refused, mut allowed) = (0, 0, 0);
    let (mut case, mut stored) = (0, 0);
    for locking in [
        Locking::NoAddresses,
        Locking::UnlockOnly,
        Locking::LockFalse,
        Locking::Locked,
    ] {
        for allow in [false, true] {
            for (label, cli) in &clis {
                case += 1;
                let name = format!("unlocked/{}-{case}.tfstate", word(&mut rng));
                let existing = rng.random_bool(0.5);
                if existing {
                    let state = gitstate_tests::state_json(&word(&mut rng), 1);
                    reader.apply(&name, "setup", &state).await;
                }
                let before = reader.get_state(&name).await;
                let base = if allow { &lenient.url } else { &strict.url };
                let work = tempfile::tempdir().expect("tempdir");
                let dir = work.path();
                let input = word(&mut rng);
                std::fs::write(
                    dir.join("main.tf"),
                    locking_config(base, &name, locking, &input),
                )
                .expect("main.tf");
                cli.ok(dir, &["init", "-no-color", "-input=false"]).await;
                let mut args = vec!["apply", "-auto-approve", "-no-color", "-input=false"];
                if locking == Locking::LockFalse {
                    args.push("-lock=false");
                }
                let out = cli.run(dir, &args).await;
                runs += 2;
                if existing || allow || locking == Locking::Locked {
                    stored += 1;
                }
                let text = transcript(&out);
                let what = format!("{label} {locking:?} allow={allow} existing={existing} {name}");
                let after = reader.get_state(&name).await;
                if locking == Locking::Locked || allow {
                    assert!(out.status.success(), "{what}:\n{text}");
                    assert!(after.body.contains(&input), "{what}: {}", after.body);
                    if locking != Locking::Locked {
                        allowed += 1;
                        let logs = gitstate_tests::captured_logs();
                        assert!(
                            logs.lines().any(|l| l.contains("WARN")
                                && l.contains("unlocked write accepted")
                                && l.contains(&name)),
                            "{what}: no warning logged"
                        );
                    }
                } else {
                    refused += 1;
                    assert!(!out.status.success(), "{what} must fail:\n{text}");
                    assert!(text.contains("428"), "{what}:\n{text}");
                    assert!(!text.contains("Apply complete"), "{what}:\n{text}");
                    assert_eq!(
                        (after.status, &after.body),
                        (before.status, &before.body),
                        "{what}: nothing written"
                    );
                    assert!(
                        dir.join("errored.tfstate").exists(),
                        "{what}: the state is kept in errored.tfstate"
                    );
                }
            }
        }
    }
    // The refused runs left no state of their own in the repository.
    let listed = reader.send("GET", "/states", None).await.expect(200).json();
    let states = listed.as_array().expect("a list").len();
    eprintln!(
        "unlocked writes: {case} generated cases, {runs} terraform/tofu runs, {refused} refused, \
         {allowed} allowed with the setting, {states} states in the repository"
    );
    assert_eq!((refused, allowed, states), (6, 6, stored));
}

/// What a generated repository holds before a backend meets it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Shape {
    /// A state Terraform wrote, on this branch, which `HEAD` names.
    StatesOn(String),
    /// A branch without states (a README), which `HEAD` names: a code repository.
    CodeOn(String),
    /// Nothing at all.
    Empty,
    /// Only a lock ref of gitstate's (another state's lock).
    OnlyLocks,
}

/// The branches of the bare repository `dir` (lock refs left out), sorted.
fn branches(dir: &Path) -> Vec<String> {
    let out = gitstate_tests::git(&["for-each-ref", "--format=%(refname)"], Some(dir));
    let mut refs: Vec<String> = out
        .lines()
        .filter(|r| r.starts_with("refs/heads/") && !r.starts_with("refs/heads/locks/"))
        .map(str::to_owned)
        .collect();
    refs.sort();
    refs
}

/// A branch is never created by accident: generated repositories (a state on `master`, on a
/// random branch name, a branch of code without states, an empty repository, one with only a
/// lock ref) × the configured ref (the default `main`, the states' branch, a random missing
/// name: a typo) × `GITSTATE_CREATE_REF` (always set for the typo). Where the configured branch
/// is missing and the repository has others, `plan` fails (400, never "to add"), the reason
/// names the branch to use and `GITSTATE_REF`, and `apply` creates no branch; where it exists,
/// the plan sees the state; in an empty repository, or with the setting where no other branch
/// holds states, the first apply creates it. The setting never starts a branch beside states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_is_never_created_by_accident() {
    init_tracing();
    let server = GitServer::start().await;
    let mut rng = StdRng::seed_from_u64(seed("missing branch"));
    let clis = [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ];
    let (mut cases, mut runs, mut refused, mut created) = (0, 0, 0, 0);
    let shapes = [
        Shape::StatesOn("master".into()),
        Shape::StatesOn(format!("b-{}", word(&mut rng))),
        Shape::CodeOn(format!("c-{}", word(&mut rng))),
        Shape::Empty,
        Shape::OnlyLocks,
    ];
    for shape in &shapes {
        for configured in 0..3 {
            cases += 1;
            let repo = format!("shape{cases}");
            let url = server.create_repo(&repo);
            let dir = server.repo_dir(&repo);
            let (label, cli) = &clis[rng.random_range(0..2)];
            let create = configured == 2 || rng.random_bool(0.3);
            match shape {
                Shape::StatesOn(branch) => {
                    // Terraform writes the state on `branch` of the still empty repository.
                    let setup = TestBackend::start(&url, &[("GITSTATE_REF", branch)]).await;
                    let work = tempfile::tempdir().expect("tempdir");
                    std::fs::write(
                        work.path().join("main.tf"),
                        format!(
                            "{}{ONE_RESOURCE}",
                            config(&setup.url, &format!("/states/{NAME}"))
                        ),
                    )
                    .expect("main.tf");
                    cli.ok(work.path(), &["init", "-no-color", "-input=false"])
                        .await;
                    cli.ok(work.path(), &["apply", "-auto-approve", "-no-color"])
                        .await;
                    runs += 2;
                    gitstate_tests::git(
                        &["symbolic-ref", "HEAD", &format!("refs/heads/{branch}")],
                        Some(&dir),
                    );
                }
                Shape::CodeOn(branch) => {
                    let bare = gitstate_tests::handmade::Bare::new(&dir, branch);
                    let readme = crate::races::by_hand("README.md");
                    bare.branch_write("README.md", Some(b"code\n"), &readme);
                    gitstate_tests::git(
                        &["symbolic-ref", "HEAD", &format!("refs/heads/{branch}")],
                        Some(&dir),
                    );
                }
                Shape::Empty => {}
                Shape::OnlyLocks => {
                    let setup = TestBackend::start(&url, &[]).await;
                    Client::new(&setup.url)
                        .lock("other.tfstate", "held")
                        .await
                        .expect(200);
                }
            }
            let states_on = match shape {
                Shape::StatesOn(branch) => Some(branch.clone()),
                _ => None,
            };
            let other = match shape {
                Shape::StatesOn(branch) | Shape::CodeOn(branch) => Some(branch.clone()),
                _ => None,
            };
            let branch = match configured {
                0 => "main".to_owned(),
                1 => other.clone().unwrap_or_else(|| "main".to_owned()),
                _ => format!("m-{}", word(&mut rng)),
            };
            let exists = other.as_deref() == Some(branch.as_str());
            let has_state = states_on.as_deref() == Some(branch.as_str());
            let may_create = exists || other.is_none() || (create && states_on.is_none());
            let mut extra = vec![("GITSTATE_REF", branch.as_str())];
            if create {
                extra.push(("GITSTATE_CREATE_REF", "true"));
            }
            let backend = TestBackend::start(&url, &extra).await;
            let before = branches(&dir);
            let what =
                format!("{label} {shape:?} GITSTATE_REF={branch} create={create} (seed above)");
            let work = tempfile::tempdir().expect("tempdir");
            std::fs::write(
                work.path().join("main.tf"),
                format!(
                    "{}{ONE_RESOURCE}",
                    config(&backend.url, &format!("/states/{NAME}"))
                ),
            )
            .expect("main.tf");
            let init = cli
                .run(work.path(), &["init", "-no-color", "-input=false"])
                .await;
            let plan = cli
                .run(work.path(), &["plan", "-no-color", "-input=false"])
                .await;
            let apply = cli
                .run(
                    work.path(),
                    &["apply", "-auto-approve", "-no-color", "-input=false"],
                )
                .await;
            runs += 3;
            let text = format!("{}{}", transcript(&init), transcript(&plan));
            let after = branches(&dir);
            if may_create {
                assert!(
                    init.status.success() && plan.status.success(),
                    "{what}:\n{text}"
                );
                assert!(apply.status.success(), "{what}:\n{}", transcript(&apply));
                assert_eq!(
                    text.contains("1 to add"),
                    !has_state,
                    "{what}: a plan sees the state exactly where it is:\n{text}"
                );
                assert!(
                    after.contains(&format!("refs/heads/{branch}")),
                    "{what}: {after:?}"
                );
                if !exists {
                    created += 1;
                }
            } else {
                refused += 1;
                assert!(
                    !plan.status.success() || !init.status.success(),
                    "{what}:\n{text}"
                );
                assert!(
                    !text.contains("to add"),
                    "{what} planned against no state:\n{text}"
                );
                assert!(text.contains("400"), "{what}:\n{text}");
                assert!(!apply.status.success(), "{what}: {}", transcript(&apply));
                assert_eq!(before, after, "{what}: no branch appears");
                let answer = Client::new(&backend.url).get_state(NAME).await;
                // The branch to use: the remote's default, or (with the setting) the one
                // holding the states.
                let default = other.clone().unwrap_or_default();
                assert!(
                    answer.status == 400
                        && answer.body.contains("GITSTATE_REF")
                        && answer.body.contains(&format!("{default:?}")),
                    "{what}: {} {}",
                    answer.status,
                    answer.body
                );
            }
        }
    }
    eprintln!(
        "missing branch: {cases} generated repositories and settings, {runs} terraform/tofu runs, \
         {refused} refused, {created} branches created where allowed"
    );
    assert!(refused > 0 && created > 0);
}

/// Every deployment on one repository speaks one protocol: generated pairs of lock ref prefixes
/// (the default `refs/heads/locks/`, `refs/locks/`, random ones), two backends on one
/// repository. The first to lock records its prefix (a ref under `refs/gitstate/protocol/`); the
/// other, whose prefix differs, refuses every lock and unlocked write (412, the reason names both
/// values) and creates no ref, so terraform or OpenTofu through it fails while through the first it applies.
/// Backends with the same prefix both work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_with_other_lock_prefixes_refuse_to_write() {
    init_tracing();
    let server = GitServer::start().await;
    let mut rng = StdRng::seed_from_u64(seed("protocol"));
    let clis = [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ];
    let (mut cases, mut runs, mut refused) = (0, 0, 0);
    for round in 0..6 {
        let mut prefix = || match rng.random_range(0..3) {
            0 => "refs/heads/locks/".to_owned(),
            1 => "refs/locks/".to_owned(),
            _ => format!("refs/{}/", word(&mut rng)),
        };
        // Round 0 always differs and round 1 always agrees, so neither branch is left untested.
        let first = prefix();
        let second = match round {
            0 => std::iter::repeat_with(&mut prefix)
                .find(|p| *p != first)
                .unwrap_or_default(),
            1 => first.clone(),
            _ => prefix(),
        };
        let same = first == second;
        cases += 1;
        let repo = format!("protocol{round}");
        let url = server.create_repo(&repo);
        let dir = server.repo_dir(&repo);
        let a = TestBackend::start(&url, &[("GITSTATE_LOCK_REF_PREFIX", &first)]).await;
        let b = TestBackend::start(&url, &[("GITSTATE_LOCK_REF_PREFIX", &second)]).await;
        let (label, cli) = &clis[rng.random_range(0..2)];
        // The first backend writes first, through Terraform: it records its prefix.
        let apply = |base: String, input: String| async move {
            let work = tempfile::tempdir().expect("tempdir");
            std::fs::write(
                work.path().join("main.tf"),
                locking_config(&base, NAME, Locking::Locked, &input),
            )
            .expect("main.tf");
            cli.ok(work.path(), &["init", "-no-color", "-input=false"])
                .await;
            cli.run(
                work.path(),
                &["apply", "-auto-approve", "-no-color", "-input=false"],
            )
            .await
        };
        let out = apply(a.url.clone(), word(&mut rng)).await;
        runs += 2;
        assert!(
            out.status.success(),
            "{label} through the first backend:\n{}",
            transcript(&out)
        );
        let record = gitstate_core::protocol::lock_prefix_record(&first);
        let shown = gitstate_tests::git(&["show", &format!("{record}:protocol.json")], Some(&dir));
        assert!(shown.contains(&format!("{first:?}")), "{record}: {shown}");
        let before = gitstate_tests::git(
            &["for-each-ref", "--format=%(refname) %(objectname)"],
            Some(&dir),
        );
        let what = format!("{label} first {first} second {second}");
        let c = Client::new(&b.url);
        let lock = c.lock(NAME, "second").await;
        if lock.status == 200 {
            c.unlock(NAME, "second").await.expect(200);
        }
        let out = apply(b.url.clone(), word(&mut rng)).await;
        runs += 2;
        if same {
            assert_eq!(lock.status, 200, "{what}: {}", lock.body);
            assert!(out.status.success(), "{what}:\n{}", transcript(&out));
        } else {
            refused += 1;
            assert_eq!(lock.status, 412, "{what}: {}", lock.body);
            assert!(
                lock.body.contains(&format!("{first:?}"))
                    && lock.body.contains(&format!("{second:?}"))
                    && lock.body.contains("GITSTATE_LOCK_REF_PREFIX"),
                "{what}: {}",
                lock.body
            );
            // A write without a lock (this backend allows them) is refused the same way.
            let write = c.write(NAME, &gitstate_tests::state_json("L", 99)).await;
            assert_eq!(write.status, 412, "{what}: {}", write.body);
            let text = transcript(&out);
            assert!(
                !out.status.success() && text.contains("412"),
                "{what}:\n{text}"
            );
            let after = gitstate_tests::git(
                &["for-each-ref", "--format=%(refname) %(objectname)"],
                Some(&dir),
            );
            assert_eq!(before, after, "{what}: nothing written, no lock ref made");
        }
    }
    eprintln!(
        "protocol: {cases} generated pairs of lock prefixes, {runs} terraform/tofu runs, \
         {refused} second backends refused"
    );
    assert!(
        refused > 0 && refused < cases,
        "both outcomes were exercised"
    );
}

/// The console's page of a missing state never reads as "no state": generated missing names at
/// `/ui/states/<name>`, where terraform and OpenTofu, pointed at them, fail (400, never "to
/// add"), while a browser (`Accept: text/html`) still gets the page's 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_pages_of_missing_states_fail_terraform() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    client
        .apply(
            "present.tfstate",
            "setup",
            &gitstate_tests::state_json("L", 1),
        )
        .await;
    let mut rng = StdRng::seed_from_u64(seed("console 404"));
    let clis = [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ];
    let http = reqwest::Client::new();
    let mut runs = 0;
    for round in 0..4 {
        let name = match rng.random_range(0..3) {
            0 => format!("{}.tfstate", word(&mut rng)),
            1 => format!("{}/{}.tfstate", word(&mut rng), word(&mut rng)),
            _ => NAME.to_owned(),
        };
        let path = format!("/ui/states/{name}");
        let api = client.send("GET", &path, None).await;
        assert_eq!(api.status, 400, "{path}: {}", api.body);
        assert!(api.body.contains("/states/<name>") && api.body.lines().count() == 1);
        let page = http
            .get(format!("{}{path}", backend.url))
            .basic_auth(
                gitstate_tests::TEST_USER,
                Some(gitstate_tests::TEST_PASSWORD),
            )
            .header("Accept", "text/html,application/xhtml+xml")
            .send()
            .await
            .expect("request");
        assert_eq!(page.status(), 404, "{path}: a browser gets the page's 404");
        let (label, cli) = &clis[round % 2];
        let work = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            work.path().join("main.tf"),
            format!("{}{ONE_RESOURCE}", config(&backend.url, &path)),
        )
        .expect("main.tf");
        let init = cli
            .run(work.path(), &["init", "-no-color", "-input=false"])
            .await;
        let plan = cli
            .run(
                work.path(),
                &["plan", "-no-color", "-input=false", "-lock=false"],
            )
            .await;
        runs += 2;
        let text = format!("{}{}", transcript(&init), transcript(&plan));
        assert!(
            !init.status.success() || !plan.status.success(),
            "{label} at {path} must fail:\n{text}"
        );
        assert!(!text.contains("to add"), "{label} at {path}:\n{text}");
    }
    eprintln!("console pages of missing states: 4 generated names, {runs} terraform/tofu runs");
}

/// terraform-backend-git's states are files at whatever path its `state=` names, most often
/// `<name>.json` (its documentation's examples) or no ending at all, not `.tfstate`. A
/// repository whose states the seed left on `master` under such names, served with a typo in
/// `GITSTATE_REF` and `GITSTATE_CREATE_REF=true`, must refuse every read as it does beside
/// `.tfstate` files (400 naming `master`), never answer "no state": Terraform would plan every
/// resource again, and the first apply would start the mistyped branch beside the states. A
/// new state the same deployment starts the branch with changes nothing: the seed's states
/// are still refused, in that process and in a fresh one (a Lambda container).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_setting_never_starts_a_branch_beside_the_seeds_json_states() {
    init_tracing();
    let server = GitServer::start().await;
    for (i, path) in ["team/app.json", "prod", "net/vpc.tfstate.json"]
        .iter()
        .enumerate()
    {
        let repo = format!("seed-json-{i}");
        let url = server.create_repo(&repo);
        let dir = server.repo_dir(&repo);
        let bare = gitstate_tests::handmade::Bare::new(&dir, "master");
        let mut write = crate::races::by_hand(path);
        write.message = "Update state\n".into();
        let state = gitstate_tests::state_json("seed", 4);
        bare.branch_write(path, Some(state.as_bytes()), &write);
        gitstate_tests::git(&["symbolic-ref", "HEAD", "refs/heads/master"], Some(&dir));
        let env = [("GITSTATE_REF", "mian"), ("GITSTATE_CREATE_REF", "true")];
        let backend = TestBackend::start(&url, &env).await;
        let client = Client::new(&backend.url);
        let refused = |answer: gitstate_tests::Answer, when: &str| {
            assert_eq!(
                answer.status, 400,
                "{path} on master, GITSTATE_REF=mian, {when}: {}",
                answer.body
            );
            assert!(answer.body.contains("master"), "{}", answer.body);
        };
        refused(client.get_state(path).await, "before the branch");
        // Near names of it (a slip when switching addresses): other letter case, the
        // `.tfstate` ending gitstate's own states have.
        let (folder, file) = path.rsplit_once('/').unwrap_or(("", path));
        let stem = gitstate_core::refs::file_stem(file);
        let tfstate = match folder {
            "" => format!("{stem}.tfstate"),
            folder => format!("{folder}/{stem}.tfstate"),
        };
        for near in [path.to_uppercase(), tfstate] {
            assert!(gitstate_core::refs::near_name(&near, path), "{near}");
            refused(client.get_state(&near).await, &format!("as {near}"));
        }
        // A name on no branch is a create, which starts the branch.
        let fresh = format!("{path}-new.tfstate");
        client.get_state(&fresh).await.expect(404);
        client
            .apply(&fresh, "L", &gitstate_tests::state_json("new", 1))
            .await;
        let started =
            gitstate_tests::git(&["rev-parse", "--verify", "refs/heads/mian"], Some(&dir));
        assert!(!started.trim().is_empty(), "the create started the branch");
        refused(client.get_state(path).await, "after the branch was started");
        let cold = TestBackend::start(&url, &env).await;
        refused(
            Client::new(&cold.url).get_state(path).await,
            "in a fresh process",
        );
    }
}

/// A deployment sets `GITSTATE_CREATE_REF=true` so that its allowlisted environments' branches
/// are made by their first write, and those environments hold states by the same names as the
/// configured branch (by design). A read of the configured branch that finds no state looks
/// for the seed's states by name on the other branches: never on gitstate's own branches, so
/// the configured branch's creates go on, in the process that made the environments and in a
/// fresh one. A seed branch (no index) holding the name still refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_setting_never_refuses_a_create_beside_environments_sharing_its_names() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("environments");
    let env = [
        ("GITSTATE_ALLOWED_REFS", "env/*"),
        ("GITSTATE_CREATE_REF", "true"),
        ("GITSTATE_ALLOW_UNLOCKED_WRITES", "true"),
    ];
    let backend = TestBackend::start(&url, &env).await;
    let client = Client::new(&backend.url);
    let first = gitstate_tests::state_json("main", 1);
    client.apply("net.tfstate", "L", &first).await;
    for branch in ["env/prod", "env/test"] {
        for name in ["net.tfstate", "app.tfstate", "team/db.tfstate"] {
            let path = format!("/states/{name}?ref={branch}");
            let state = gitstate_tests::state_json(branch, 1);
            let answer = client.send("POST", &path, Some(&state)).await;
            assert_eq!(answer.status, 200, "POST {path}: {}", answer.body);
        }
    }
    let cold = TestBackend::start(&url, &env).await;
    let cold = Client::new(&cold.url);
    for (who, c, name) in [
        ("the process that made them", &client, "app.tfstate"),
        ("a fresh process", &cold, "team/db.tfstate"),
    ] {
        let read = c.get_state(name).await;
        assert_eq!(read.status, 404, "{name} through {who}: {}", read.body);
        c.apply(name, "L", &gitstate_tests::state_json("main", 1))
            .await;
    }
    let dir = server.repo_dir("environments");
    let bare = gitstate_tests::handmade::Bare::new(&dir, "seed");
    let mut write = crate::races::by_hand("team/web.json");
    write.message = "Update state\n".into();
    let seed = gitstate_tests::state_json("seed", 4);
    bare.branch_write("team/web.json", Some(seed.as_bytes()), &write);
    let read = cold.get_state("team/web.json").await;
    assert_eq!(read.status, 400, "the seed's state by name: {}", read.body);
    assert!(read.body.contains("seed"), "{}", read.body);
}
