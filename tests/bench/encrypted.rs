//! Issue 15's encrypted measurements: a cold read of one state among many sealed ones (filter on
//! and off), the repository's growth per rewrite (plaintext and encrypted) and the Lambda
//! binary's start-up plus first cold GET under cargo-lambda's emulator.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{Client, GitServer, Moto, git, realistic_state, stored_file};

use super::{COLD_RUNS, Sample, ms, scale};

/// The state every cold read asks for.
pub(super) const READ: &str = "team/s0007.tfstate";

/// A `gitstate serve` on `url` that seals with `alias/bench` on `moto` when `moto` is given.
async fn server(binary: &Path, dir: &Path, url: &str, moto: Option<&Moto>) -> ServeProcess {
    let mut extra: Vec<(&str, String)> = vec![("RUST_LOG", "warn".into())];
    if let Some(moto) = moto {
        extra.push(("GITSTATE_KMS_KEY_IDS", "alias/bench".into()));
        extra.extend(moto.env());
    }
    let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    ServeProcess::start(binary, dir, serve_env(url, &extra)).await
}

/// `states` realistic 48 KB states written through one encrypting `gitstate serve` (so each is
/// sealed as production seals it, with the index kept alongside), then packed as a host keeps
/// them. Returns the seconds the writes took.
pub(super) async fn sealed_repo(
    server_: &GitServer,
    name: &str,
    states: usize,
    binary: &Path,
    moto: &Moto,
) -> f64 {
    let url = server_.create_repo(name);
    let dir = tempfile::tempdir().expect("tempdir");
    let writer = server(binary, dir.path(), &url, Some(moto)).await;
    let client = Client::new(&writer.url);
    let started = Instant::now();
    for s in 0..states {
        let body = realistic_state(s as u64, 60, 1);
        let put = client
            .send(
                "POST",
                &format!("/states/team/s{s:04}.tfstate"),
                Some(&body),
            )
            .await;
        assert_eq!(put.status, 200, "seal s{s:04}: {}", put.body);
    }
    let took = started.elapsed().as_secs_f64();
    drop(writer);
    let stored = stored_file(server_, name, READ);
    assert!(
        String::from_utf8_lossy(&stored).contains("\"sops\""),
        "{READ} is not sealed in {name}"
    );
    git(&["repack", "-adq"], Some(&server_.repo_dir(name)));
    took
}

/// Bytes of every pack of the bare repository `dir`.
fn pack_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir.join("objects/pack"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum()
}

/// One cold read of [`READ`] from a fresh `gitstate serve`: time, git requests, bytes fetched.
async fn cold_read(
    git_server: &GitServer,
    binary: &Path,
    dir: &Path,
    url: &str,
    moto: &Moto,
) -> (Duration, usize, u64) {
    std::fs::create_dir_all(dir).expect("dir");
    let p = server(binary, dir, url, Some(moto)).await;
    let c = Client::new(&p.url);
    // argon2 paid outside the measurement (one advertisement, no fetch).
    c.send("GET", "/locks/warm-up.tfstate", None).await;
    git_server.take_requests();
    let started = Instant::now();
    let got = c.send("GET", &format!("/states/{READ}"), None).await;
    let time = started.elapsed();
    assert_eq!(
        got.status,
        200,
        "cold read of {url}: {}\n{}",
        got.body,
        p.log_text()
    );
    assert_eq!(got.body, realistic_state(7, 60, 1), "the state as written");
    let seen = git_server.take_requests();
    (time, seen.len(), seen.iter().map(|r| r.bytes).sum())
}

/// `extra` files added to the sealed repository `name`, standing in for more sealed states:
/// base64 text of random bytes, as long as the sealed [`READ`] (so they weigh and compress as
/// ciphertext does; they are never read), in one more commit, then packed. (A copy under
/// another name would not do: a sealed file is bound to its repository's URL.)
fn add_stand_ins(server_: &GitServer, name: &str, extra: usize) {
    use base64::Engine as _;
    use rand::{RngCore as _, SeedableRng as _};
    let dir = server_.repo_dir(name);
    let length = stored_file(server_, name, READ).len();
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let mut stream = Vec::new();
    stream.extend_from_slice(
        b"commit refs/heads/main\ncommitter bench <b@x> 1700000000 +0000\ndata 10\nstand-ins\n\
          from refs/heads/main^0\n",
    );
    for k in 0..extra {
        let mut raw = vec![0u8; length * 3 / 4];
        rng.fill_bytes(&mut raw);
        let text = base64::engine::general_purpose::STANDARD.encode(&raw);
        write!(
            stream,
            "M 100644 inline more/f{k:04}.tfstate\ndata {}\n{text}\n",
            text.len()
        )
        .expect("write");
    }
    gitstate_tests::fast_import(&dir, &stream, &[]);
    git(&["repack", "-adq"], Some(&dir));
}

/// One table row: cold reads of [`READ`] in the repository `name`, filter on and off
/// alternating run by run.
async fn cold_rows(
    out: &mut String,
    git_server: &GitServer,
    binary: &Path,
    name: &str,
    label: &str,
    moto: &Moto,
) {
    let url = git_server.url(name);
    let root = tempfile::tempdir().expect("tempdir");
    let mut rows = [
        (true, Sample::default(), 0u64),
        (false, Sample::default(), 0),
    ];
    for run in 0..COLD_RUNS {
        for (filter, sample, bytes) in &mut rows {
            git_server.allow_filter(name, *filter);
            let dir = root.path().join(format!("{filter}-{run}"));
            let (time, reqs, b) = cold_read(git_server, binary, &dir, &url, moto).await;
            sample.add(time, reqs);
            *bytes = b;
        }
    }
    let packed = pack_bytes(&git_server.repo_dir(name));
    for (filter, sample, bytes) in &rows {
        let target = if *filter && !label.contains('+') {
            let met = *bytes <= 250 * 1024 && sample.requests.iter().all(|r| *r <= 3);
            format!(
                "≤ 250 KB, ≤ 3 requests: {}",
                if met { "met" } else { "MISSED" }
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "| {label} | {packed} | {} | {} | {bytes} | {} | {} | {target} |\n",
            if *filter { "on" } else { "off" },
            sample.reqs(),
            ms(sample.pct(0.5)),
            ms(sample.pct(1.0)),
        ));
    }
}

/// Cold read of one state among `states` encrypted ones (and among ten times as many), filter
/// on and off, alternating run by run on the same repository.
pub async fn cold_read_encrypted(out: &mut String, binary: &Path) {
    let states = scale(200, 20);
    let moto = Moto::start().await;
    moto.create_key("bench").await;
    let git_server = GitServer::start().await;
    let sealing = sealed_repo(&git_server, "sealed", states, binary, &moto).await;
    out.push_str(&format!(
        "## Cold read of one state among {states} encrypted states\n\n\
         {states} realistic 48 KB states (60 resources each) sealed with KMS (moto on loopback) \
         through one `gitstate serve` ({sealing:.1} s for the {states} writes), then packed. A \
         fresh `gitstate serve` with an empty cache reads one state; bytes = every git answer's \
         body. The filter on and off alternate run by run on the same repository ({COLD_RUNS} \
         runs each); the time includes the KMS `Decrypt` of the data key. Then the same repository \
         gets {} more files standing in for more sealed states (base64 of random bytes, as long as a \
         sealed state: ciphertext's weight and compressibility; never read).\n\n\
         | states | packed bytes | filter | git reqs | bytes fetched | p50 ms | max ms | target |\n\
         |---|---:|---|---:|---:|---:|---:|---|\n",
        states * 9
    ));
    cold_rows(
        out,
        &git_server,
        binary,
        "sealed",
        &format!("{states} sealed"),
        &moto,
    )
    .await;
    add_stand_ins(&git_server, "sealed", states * 9);
    let label = format!("{states} sealed + {} stand-ins", states * 9);
    cold_rows(out, &git_server, binary, "sealed", &label, &moto).await;
    out.push('\n');
}

/// Bytes the packed repository `name` grows by per rewrite of one 48 KB state through `p`,
/// over `rewrites` rewrites (`git gc` before and after, so both sides are one pack).
async fn growth_of(git_server: &GitServer, name: &str, p: &ServeProcess, rewrites: u64) -> f64 {
    let c = Client::new(&p.url);
    let path = "/states/app/prod.tfstate";
    let write = |serial: u64| {
        let body = realistic_state(42, 60, serial);
        let c = &c;
        async move {
            let w = c.send("POST", path, Some(&body)).await;
            assert_eq!(w.status, 200, "rewrite {serial}: {}", w.body);
        }
    };
    write(1).await;
    let repo = git_server.repo_dir(name);
    git(&["gc", "-q"], Some(&repo));
    let before = pack_bytes(&repo);
    for serial in 2..rewrites + 2 {
        write(serial).await;
    }
    git(&["gc", "-q"], Some(&repo));
    let after = pack_bytes(&repo);
    (after - before) as f64 / rewrites as f64
}

/// Growth per rewrite of one 48 KB state, plaintext and encrypted side by side.
pub async fn growth(out: &mut String, binary: &Path) {
    let rewrites = scale(50, 5) as u64;
    let moto = Moto::start().await;
    moto.create_key("bench").await;
    let git_server = GitServer::start().await;
    let root = tempfile::tempdir().expect("tempdir");
    let mut rows = Vec::new();
    for (label, kms) in [("plaintext", None), ("encrypted", Some(&moto))] {
        let url = git_server.create_repo(label);
        let dir = root.path().join(label);
        std::fs::create_dir_all(&dir).expect("dir");
        let p = server(binary, &dir, &url, kms).await;
        let per = growth_of(&git_server, label, &p, rewrites).await;
        let stored = stored_file(&git_server, label, "app/prod.tfstate");
        rows.push((label, per, stored.len()));
    }
    out.push_str(&format!(
        "## Growth per rewrite of one 48 KB state\n\n\
         One realistic state of 60 resources ({} bytes of JSON) written once, then rewritten \
         {rewrites} times through `gitstate serve`, each rewrite changing one resource's \
         description (a new serial), without a lock. Growth = the packs' bytes after `git gc` \
         minus before, divided by {rewrites}: the state's blob, its tree, the commit and the \
         index's change.\n\n\
         | stored as | file in git, bytes | growth per rewrite, bytes | target |\n\
         |---|---:|---:|---|\n",
        realistic_state(42, 60, 1).len()
    ));
    for (label, per, stored) in rows {
        let target = if label == "encrypted" {
            format!("≤ 8 KB: {}", if per <= 8192.0 { "met" } else { "MISSED" })
        } else {
            String::new()
        };
        out.push_str(&format!("| {label} | {stored} | {per:.0} | {target} |\n"));
    }
    out.push('\n');
}
