//! `gitstate config` and the settings layers through the real binary: flag over environment over
//! file, `--config PATH`, unknown keys, redaction; `user add` entries that parse.

use std::path::Path;
use std::process::Output;

fn gitstate(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = std::process::Command::new(crate::GITSTATE);
    command.args(args).current_dir(dir);
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("GITSTATE_")) {
        command.env_remove(key);
    }
    command
        .envs(env.iter().copied())
        .output()
        .expect("gitstate runs")
}

/// The row of `setting` in `gitstate config`'s table: (value, origin).
fn row(out: &str, setting: &str) -> (String, String) {
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(setting))
        .unwrap_or_else(|| panic!("no row for {setting} in\n{out}"));
    let mut words = line.split_whitespace().skip(1);
    let value = words.next().expect("value").to_owned();
    (value, words.collect::<Vec<_>>().join(" "))
}

#[test]
fn config_shows_each_layer_in_order_and_redacts() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("gitstate.toml"),
        "ref = \"from-file\"\nlisten = \"127.0.0.1:9001\"\ncommitter_name = \"file-bot\"\n\
         git_token = \"file-secret-1\"\nmax_body_bytes = 1000\n\
         repository = \"https://bot:url-secret-2@git.example/o/r.git\"\n",
    )
    .expect("file");
    let out = gitstate(
        dir.path(),
        &["config", "--ref", "from-flag"],
        &[
            ("GITSTATE_REF", "from-env"),
            ("GITSTATE_LISTEN", "127.0.0.1:9002"),
            ("GITSTATE_PASSPHRASE", "env-secret-3"),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let error = String::from_utf8_lossy(&out.stderr).into_owned();
    // The table is shown, redacted, and then the URL's credentials make the settings invalid.
    assert!(!out.status.success(), "{text}{error}");
    assert!(
        error.contains("GITSTATE_REPOSITORY") && error.contains("GITSTATE_GIT_TOKEN"),
        "{error}"
    );
    assert!(!error.contains("url-secret-2"), "{error}");
    assert_eq!(row(&text, "ref"), ("from-flag".into(), "flag --ref".into()));
    assert_eq!(
        row(&text, "listen"),
        ("127.0.0.1:9002".into(), "env GITSTATE_LISTEN".into())
    );
    assert_eq!(
        row(&text, "committer_name"),
        ("file-bot".into(), "file gitstate.toml".into())
    );
    assert_eq!(row(&text, "max_body_bytes").0, "1000");
    assert_eq!(
        row(&text, "cache_dir"),
        (".gitstate/cache".into(), "default".into())
    );
    assert_eq!(row(&text, "git_token").0, "***");
    assert_eq!(row(&text, "passphrase").0, "***");
    assert_eq!(
        row(&text, "repository").0,
        "https://bot:***@git.example/o/r.git"
    );
    for secret in ["file-secret-1", "url-secret-2", "env-secret-3"] {
        assert!(!text.contains(secret), "{secret} printed");
    }
    // Secrets are never flags: they would show in the process list.
    let out = gitstate(dir.path(), &["config", "--git-token", "x"], &[]);
    assert!(!out.status.success());
}

/// Every secret setting of the list, from the environment and from the file: `gitstate config`
/// shows `***`, its output and errors never hold the value, and the settings are still valid
/// (the value was read, not dropped).
#[test]
fn config_never_prints_any_secret_setting() {
    let secrets: Vec<_> = gitstate_app::layers::SETTINGS
        .iter()
        .filter(|spec| spec.secret)
        .collect();
    assert!(secrets.len() >= 5, "{secrets:?}");
    for (i, spec) in secrets.into_iter().enumerate() {
        let value = format!("never-shown-{i}-{}", rand::random::<u64>());
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("gitstate.toml"),
            format!("{} = {value:?}\n", spec.key()),
        )
        .expect("file");
        let from_file = gitstate(dir.path(), &["config"], &[]);
        let empty = tempfile::tempdir().expect("tempdir");
        let from_env = gitstate(empty.path(), &["config"], &[(spec.var, &value)]);
        for (layer, out) in [("file", from_file), ("env", from_env)] {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let error = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(out.status.success(), "{} from {layer}: {error}", spec.var);
            assert_eq!(
                row(&text, &spec.key()).0,
                "***",
                "{} from {layer}",
                spec.var
            );
            assert!(
                !text.contains(&value) && !error.contains(&value),
                "{} from {layer} printed:\n{text}{error}",
                spec.var
            );
        }
    }
}

#[test]
fn explicit_file_unknown_keys_and_invalid_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("gitstate.toml"), "ref = \"cwd\"\n").expect("file");
    std::fs::write(dir.path().join("other.toml"), "ref = \"other\"\n").expect("file");
    let out = gitstate(dir.path(), &["config", "--config", "other.toml"], &[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        row(&text, "ref"),
        ("other".into(), "file other.toml".into())
    );

    for (file, needle) in [
        ("refs = \"x\"\n", "unknown key `refs`"),
        ("GITSTATE_LISTEN = \"x\"\n", "did you mean `listen`"),
        ("ref = [\"a\", 1]\n", "`ref` must be"),
        ("ref = \"a..b\"\n", "GITSTATE_REF"),
        ("listen = \"nowhere\"\n", "GITSTATE_LISTEN"),
    ] {
        std::fs::write(dir.path().join("bad.toml"), file).expect("file");
        let out = gitstate(dir.path(), &["config", "--config", "bad.toml"], &[]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{file}");
        assert!(err.contains(needle), "{file}: {err}");
    }
    // A missing --config file is an error; a missing ./gitstate.toml is not.
    let out = gitstate(dir.path(), &["config", "--config", "absent.toml"], &[]);
    assert!(!out.status.success());
    let empty = tempfile::tempdir().expect("tempdir");
    assert!(gitstate(empty.path(), &["config"], &[]).status.success());
    // serve reads the same layers: a bad file stops it before it binds anything.
    std::fs::write(
        dir.path().join("gitstate.toml"),
        "lisen = \"127.0.0.1:0\"\n",
    )
    .expect("file");
    let out = gitstate(dir.path(), &["serve"], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown key `lisen`"));
}

/// Every user name the access file accepts (dots, @, dashes) makes an entry that parses back to
/// that name.
#[test]
fn user_add_entries_parse_for_every_name_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["first.last", "a@b.example", "ci-bot_2", "x", "1.2.3"] {
        let out = gitstate(
            dir.path(),
            &[
                "user",
                "add",
                "--print",
                name,
                "--grant",
                "write:network/",
                "--grant",
                "read:*",
            ],
            &[],
        );
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let entry = String::from_utf8_lossy(&out.stdout);
        let policy = gitstate_core::access::Policy::parse(&entry).expect("entry parses");
        let users: Vec<_> = policy.users().map(|u| u.name.clone()).collect();
        assert_eq!(users, [name]);
    }
}

/// Through the binary: a misspelt `GITSTATE_*` variable, an empty one, an empty flag and a
/// misspelt flag stop every command at start, naming what was wrong and the name it misses.
#[test]
fn unknown_and_empty_input_stops_every_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    for args in [
        &["config"][..],
        &["serve", "--listen", "127.0.0.1:0"][..],
        &["list"][..],
        &["run", "--state", "x.tfstate", "--", "true"][..],
    ] {
        for (env, needles) in [
            (
                ("GITSTATE_REPOSITRY", "x"),
                &["unknown variable GITSTATE_REPOSITRY", "GITSTATE_REPOSITORY"][..],
            ),
            (("GITSTATE_REF", ""), &["GITSTATE_REF is set but empty"][..]),
            (
                ("GITSTATE_GIT_TOKEN", " "),
                &["GITSTATE_GIT_TOKEN is set but empty"][..],
            ),
        ] {
            let out = gitstate(dir.path(), args, &[env]);
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(!out.status.success(), "{args:?} {env:?}");
            for needle in needles {
                assert!(err.contains(needle), "{args:?} {env:?}: {err}");
            }
        }
    }
    let out = gitstate(dir.path(), &["config", "--ref="], &[]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(err.contains("--ref is empty"), "{err}");
    let out = gitstate(dir.path(), &["config", "--repositry", "x"], &[]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(
        err.contains("--repositry") && err.contains("--repository"),
        "{err}"
    );
    // Every setting's effective value is shown, defaults included.
    let out = gitstate(dir.path(), &["config"], &[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(row(&text, "ref"), ("main".into(), "default".into()));
    assert_eq!(
        row(&text, "listen"),
        ("127.0.0.1:8080".into(), "default".into())
    );
}
