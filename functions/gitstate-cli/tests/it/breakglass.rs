//! `gitstate encrypt` / `gitstate decrypt` as an operator runs them in an emergency: the binary,
//! the standard AWS configuration from the environment (`AWS_ENDPOINT_URL_KMS` pointing at a
//! moto server on loopback), and the stock Go sops 3.11 as an independent reader of the result.

use std::process::Command;

use gitstate_tests::Moto;

/// The standard AWS settings of an operator's shell, pointing at `moto`.
fn aws_env<'a>(cmd: &'a mut Command, moto: &Moto) -> &'a mut Command {
    cmd.envs(moto.env()).env_remove("AWS_PROFILE")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypt_then_decrypt_with_the_cli_and_sops311() {
    let moto = Moto::start().await;
    // a key with the alias the operator names
    moto.create_key("cli").await;

    let dir = tempfile::tempdir().expect("tempdir");
    let plain = dir.path().join("prod.tfstate");
    let text = "{\"version\":4,\"serial\":1,\"lineage\":\"x\",\"outputs\":{\"pw\":{\"value\":\"s3cr3t-pw\"}}}\n";
    std::fs::write(&plain, text).expect("write");

    let bin = crate::GITSTATE;
    let mut encrypt = Command::new(bin);
    encrypt
        .args([
            "encrypt",
            "--state",
            "env/prod.tfstate",
            "--repository",
            "https://git.example/o/s.git",
        ])
        .arg(&plain)
        .env("GITSTATE_KMS_KEY_IDS", "alias/cli");
    let sealed = aws_env(&mut encrypt, &moto).output().expect("encrypt runs");
    assert!(
        sealed.status.success(),
        "{}",
        String::from_utf8_lossy(&sealed.stderr)
    );
    let sealed_text = String::from_utf8(sealed.stdout).expect("utf-8");
    assert!(sealed_text.contains("\"sops\"") && !sealed_text.contains("s3cr3t-pw"));
    let file = dir.path().join("sealed.tfstate");
    std::fs::write(&file, &sealed_text).expect("write");

    let mut decrypt = Command::new(bin);
    decrypt
        .arg("decrypt")
        .arg(&file)
        .env_remove("GITSTATE_KMS_KEY_IDS");
    let opened = aws_env(&mut decrypt, &moto).output().expect("decrypt runs");
    assert!(
        opened.status.success(),
        "{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    assert_eq!(opened.stdout, text.as_bytes());

    // the stock sops 3.11, piped into gzip as docs/operating.md says
    let oracle = gitstate_tests::sops::break_glass(sealed_text.as_bytes(), &moto.env());
    assert_eq!(oracle, text.as_bytes());
}

/// OpenPGP alone, as an operator without KMS has it: `gitstate encrypt` seals for a fingerprint
/// with the armored public key only; `gitstate decrypt` opens with the passphrase-protected
/// secret key (made by `gpg --quick-gen-key` with a passphrase) and the passphrase, and not
/// without it; sops 3.11 opens the file through gpg to the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypt_then_decrypt_with_openpgp_alone() {
    use gitstate_tests::sops::{break_glass, gpg_key_as};
    let moto = Moto::start().await;
    let passphrase = "operator passphrase ✓";
    let key = gpg_key_as(
        "operator <operator@example.invalid>",
        "future-default",
        passphrase,
        "--export-secret-keys",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = dir.path().join("prod.tfstate");
    let text = "{\"version\":4,\"serial\":1,\"lineage\":\"x\",\"outputs\":{\"pw\":{\"value\":\"s3cr3t-pw\"}}}\n";
    std::fs::write(&plain, text).expect("write");

    let bin = crate::GITSTATE;
    let mut encrypt = Command::new(bin);
    encrypt
        .args([
            "encrypt",
            "--state",
            "env/prod.tfstate",
            "--repository",
            "https://git.example/o/s.git",
        ])
        .arg(&plain)
        .env("GITSTATE_PGP_FINGERPRINTS", &key.fp)
        .env("GITSTATE_PGP_PUBLIC_KEYS_FILE", &key.public);
    let sealed = aws_env(&mut encrypt, &moto).output().expect("encrypt runs");
    assert!(
        sealed.status.success(),
        "{}",
        String::from_utf8_lossy(&sealed.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&sealed.stdout).expect("json");
    assert_eq!(doc["sops"]["pgp"][0]["fp"], key.fp.as_str());
    assert!(doc["sops"].get("kms").is_none() && doc["gitstate_binding"].is_string());
    let file = dir.path().join("sealed.tfstate");
    std::fs::write(&file, &sealed.stdout).expect("write");

    let decrypt = |with_passphrase: bool| {
        let mut decrypt = Command::new(bin);
        decrypt
            .arg("decrypt")
            .arg(&file)
            .env("GITSTATE_PGP_SECRET_KEYS_FILE", &key.secret);
        if with_passphrase {
            decrypt.env("GITSTATE_PGP_PASSPHRASE", passphrase);
        }
        aws_env(&mut decrypt, &moto).output().expect("decrypt runs")
    };
    let opened = decrypt(true);
    assert!(
        opened.status.success(),
        "{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    assert_eq!(opened.stdout, text.as_bytes());
    let refused = decrypt(false);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && refused.stdout.is_empty());
    assert!(
        stderr.contains(&key.fp) && stderr.contains("GITSTATE_PGP_PASSPHRASE"),
        "{stderr}"
    );
    assert!(break_glass(&sealed.stdout, &key.sops_env(passphrase)) == text.as_bytes());
}

/// docs/operating.md, "Unfolded writes", followed as an operator would with the git CLI and the
/// binary against the real git server: generated writes sit on state refs the branch lacks; the
/// documented lines list them and read each state's newest content; `gitstate fold` folds them;
/// then the branch has every write once (`git log -- PATH`) and the record names the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfolded_writes_are_read_and_folded_as_documented() {
    use gitstate_tests::handmade::{Bare, Stamp, StateWrite};
    use rand::{Rng, SeedableRng};
    let server = gitstate_tests::GitServer::start().await;
    let url = server.create_repo("glass");
    let bare = Bare::new(&server.repo_dir("glass"), "main");
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xb4ea);
    let paths = ["team/app.tfstate", "net/core.tfstate", "solo.tfstate"];
    let stamp = |who: &str, at: i64| Stamp {
        name: who.to_owned(),
        email: format!("{who}@example.invalid"),
        date: format!("{at} +0000"),
    };
    let mut newest = std::collections::BTreeMap::new();
    let mut writes = std::collections::BTreeMap::new();
    for (i, path) in paths.iter().enumerate() {
        let created = format!("{{\"created\":{i}}}\n");
        let write = StateWrite {
            path: (*path).to_owned(),
            content: Vec::new(),
            author: stamp("ann", 1_700_000_000),
            committer: stamp("gitstate", 1_700_000_000),
            message: format!("create {path}\n"),
        };
        bare.branch_write(path, Some(created.as_bytes()), &write);
        newest.insert(*path, created.into_bytes());
    }
    // The last state keeps its file on the branch only.
    for step in 0..rng.random_range(4..9) {
        let path = paths[rng.random_range(0..2)];
        let content = format!("{{\"serial\":{step}}}\n").into_bytes();
        bare.state_write(&StateWrite {
            path: path.to_owned(),
            content: content.clone(),
            author: stamp(["ann", "bob"][rng.random_range(0..2)], 1_700_000_100 + step),
            committer: stamp("gitstate", 1_700_000_100 + step),
            message: format!("write {path} (serial {step})\n\nSerial: {step}\nUser: ann\n"),
        });
        newest.insert(path, content);
        *writes.entry(path).or_insert(0usize) += 1;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let clone = work.path().join("clone");
    let sh = |script: &str| {
        let out = Command::new("sh")
            .args(["-c", script])
            .current_dir(&clone)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", work.path())
            .output()
            .expect("sh runs");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    gitstate_tests::git(
        &[
            "clone",
            "-q",
            &server.url_with_credentials("glass"),
            clone.to_str().expect("utf-8"),
        ],
        None,
    );
    let listed =
        String::from_utf8(sh("git ls-remote origin 'refs/gitstate/states/*'")).expect("utf-8");
    for path in writes.keys() {
        let state = bare.state_ref(path);
        assert!(listed.contains(&state), "{path} in {listed}");
    }
    assert_eq!(listed.lines().count(), writes.len(), "{listed}");
    for path in paths {
        let read = if writes.contains_key(path) {
            sh(&format!(
                "P={path}\ngit fetch -q origin \"refs/gitstate/states/main/$(printf %s \"$P\" | sha1sum | cut -c1-40)\" && git show \"FETCH_HEAD:$P\""
            ))
        } else {
            sh(&format!("P={path}\ngit show \"origin/main:$P\""))
        };
        assert_eq!(
            read, newest[path],
            "{path}: the newest content, read by hand"
        );
    }
    let fold = gitstate_fold(&url, work.path());
    let said = String::from_utf8_lossy(&fold.stdout).into_owned();
    assert!(
        fold.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&fold.stderr)
    );
    let total: usize = writes.values().sum();
    assert!(
        said.contains(&format!(
            "folded {total} write(s) of {} state(s)",
            writes.len()
        )),
        "{said}"
    );
    let record: serde_json::Value = serde_json::from_slice(&sh(
        "git fetch -q origin main && git show origin/main:.gitstate/folded.json",
    ))
    .expect("the record is JSON");
    for (path, count) in &writes {
        let state = bare.state_ref(path);
        let tip = sh(&format!("git ls-remote origin {state} | cut -f1"));
        assert_eq!(
            record[*path].as_str(),
            Some(String::from_utf8_lossy(&tip).trim()),
            "{path}"
        );
        let log = String::from_utf8(sh(&format!("git log --format=%B origin/main -- {path}")))
            .expect("utf-8");
        assert_eq!(
            log.matches("State-commit: ").count(),
            *count,
            "{path}: {log}"
        );
    }
    for path in paths {
        assert_eq!(
            sh(&format!("git show origin/main:{path}")),
            newest[path],
            "{path}: the branch is current"
        );
    }
    assert!(
        sh("git ls-remote origin refs/gitstate/fold").is_empty(),
        "no lease left"
    );
}

/// `gitstate fold` against `url`, as an operator runs it, with a cache and HOME under `work`.
pub(crate) fn gitstate_fold(url: &str, work: &std::path::Path) -> std::process::Output {
    Command::new(crate::GITSTATE)
        .args(["fold", "--repository", url])
        .env("GITSTATE_GIT_USERNAME", gitstate_tests::GIT_USER)
        .env("GITSTATE_GIT_TOKEN", gitstate_tests::GIT_TOKEN)
        .env("GITSTATE_CACHE_DIR", work.join("cache"))
        .env("HOME", work)
        .output()
        .expect("gitstate fold runs")
}

/// A `gitstate fold` that cannot fold fails, with its reason, and moves nothing: while another
/// fold holds a fresh lease (a script's `gitstate fold && git pull` must not go on to a branch
/// this run did not bring up to date), and while `.gitstate/folded.json` on the branch is not a
/// record (generated damage: folding from it could replay writes twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_that_cannot_fold_fails_with_its_reason() {
    use gitstate_tests::handmade::{Bare, Stamp, StateWrite};
    use rand::{Rng, SeedableRng};
    let server = gitstate_tests::GitServer::start().await;
    let url = server.create_repo("stuck");
    let bare = Bare::new(&server.repo_dir("stuck"), "main");
    let write = |path: &str, message: &str| StateWrite {
        path: path.to_owned(),
        content: format!("{{\"serial\":2,\"path\":\"{path}\"}}\n").into_bytes(),
        author: Stamp {
            name: "ann".into(),
            email: "ann@example.invalid".into(),
            date: "1700000000 +0000".into(),
        },
        committer: Stamp {
            name: "gitstate".into(),
            email: "gitstate@example.invalid".into(),
            date: "1700000000 +0000".into(),
        },
        message: message.to_owned(),
    };
    let path = "team/app.tfstate";
    bare.branch_write(path, Some(b"{\"serial\":1}\n"), &write(path, "create\n"));
    bare.state_write(&write(path, "write\n\nSerial: 2\n"));
    let work = tempfile::tempdir().expect("tempdir");
    let failed = |why: &str, expect: &str| {
        let tip = bare.tip("main");
        let out = gitstate_fold(&url, work.path());
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{why}: exit 0: {said}");
        assert!(said.contains(expect), "{why}: {said}");
        assert_eq!(bare.tip("main"), tip, "{why}: the branch moved");
    };

    // A fresh lease, held by someone else.
    let empty_tree = bare.git(&["mktree"], &[], b"");
    let lease = bare.git(
        &[
            "commit-tree",
            &empty_tree,
            "-m",
            "fold lease held by a test",
        ],
        &[],
        b"",
    );
    bare.git(
        &["update-ref", "refs/gitstate/fold", &lease, &"0".repeat(40)],
        &[],
        b"",
    );
    failed("a held lease", "another fold holds the lease");
    bare.git(
        &["update-ref", "-d", "refs/gitstate/fold", &lease],
        &[],
        b"",
    );

    // Damaged records: cut, other JSON, other values, binary.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xf01d);
    let good = format!("{{\"{path}\": \"{}\"}}", "0".repeat(40));
    for round in 0..12 {
        let damaged: Vec<u8> = match round % 4 {
            0 => good.as_bytes()[..rng.random_range(0..good.len())].to_vec(),
            1 => ["[]", "null", "1", "\"x\""][rng.random_range(0..4)].into(),
            2 => format!("{{\"{path}\": {}}}", rng.random_range(0..1000)).into_bytes(),
            _ => (0..rng.random_range(1..40))
                .map(|_| rng.random::<u8>())
                .collect(),
        };
        if serde_json::from_slice::<std::collections::BTreeMap<String, String>>(&damaged).is_ok() {
            continue;
        }
        bare.branch_write(
            ".gitstate/folded.json",
            Some(&damaged),
            &write(path, "damage the record\n"),
        );
        failed(
            &format!("record {damaged:?}"),
            ".gitstate/folded.json on the branch cannot be read",
        );
    }
    assert!(
        bare.tip(&bare.state_ref(path)).is_some(),
        "the state ref is untouched"
    );
}
