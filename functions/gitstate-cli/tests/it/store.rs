//! One store, whatever the directory: generated directory layouts around an embedded store, and
//! `gitstate run -- terraform [-chdir=…] plan` from every directory of them sees the same
//! state (a new, empty store would make the plan want to create it); from outside, the run
//! refuses to start a new store unless `--new-store` says so. A `state` in the root's
//! gitstate.toml is the root configuration's: taken where Terraform runs at the root, refused
//! (naming the file) for a configuration below it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use rand::{Rng, SeedableRng};

const STATE: &str = "team/app.tfstate";

fn run(work: &Path, tfrc: &Path, args: &[&str], state: bool) -> Output {
    let mut command = Command::new(crate::GITSTATE);
    command.arg("run");
    if state {
        command.args(["--state", STATE]);
    }
    command
        .args(args)
        .current_dir(work)
        .env_remove("GITSTATE_REPOSITORY")
        .env_remove("GITSTATE_LOCAL_REPOSITORY")
        .env_remove("TF_HTTP_USERNAME")
        .env_remove("TF_HTTP_PASSWORD")
        .env_remove("TF_CLI_ARGS")
        .env("TF_CLI_CONFIG_FILE", tfrc)
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_INPUT", "0")
        .stdin(Stdio::null())
        .output()
        .expect("gitstate run starts")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every `.gitstate/repo.git` under `dir`.
fn stores(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if d.join(".gitstate/repo.git").is_dir() {
            found.push(d.clone());
        }
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir()
                && entry.file_name() != ".gitstate"
                && entry.file_name() != ".terraform"
            {
                stack.push(path);
            }
        }
    }
    found
}

#[test]
fn one_store_from_every_directory_and_no_new_one_by_accident() {
    let seed = std::env::var("STORE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("STORE_TEST_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let words = ["infra", "app", "env", "prod", "modules", "net"];
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("project");
    let tfrc = tmp.path().join("empty.tfrc");
    std::fs::write(&tfrc, "").expect("tfrc");
    // The configuration, 0–3 directories below the root.
    let depth = rng.random_range(0..4);
    let config = (0..depth).fold(root.clone(), |d, _| {
        d.join(words[rng.random_range(0..words.len())])
    });
    std::fs::create_dir_all(&config).expect("config dir");
    std::fs::write(
        config.join("main.tf"),
        "resource \"terraform_data\" \"x\" {\n  input = \"one store\"\n}\n",
    )
    .expect("main.tf");
    // Half the layouts name the state in a gitstate.toml at the root, which must be found too.
    // Its `state` names the root configuration's state: taken only where Terraform runs at the
    // root (from any directory, through -chdir); for a configuration below, --state names it.
    let toml = rng.random_bool(0.5);
    if toml {
        std::fs::write(root.join("gitstate.toml"), format!("state = \"{STATE}\"\n")).expect("toml");
    }
    let file_state = toml && config == root;
    let chdir = |from: &Path| -> Vec<String> {
        if from == config {
            Vec::new()
        } else {
            let target = config
                .strip_prefix(from)
                .map_or_else(|_| config.clone(), Path::to_path_buf);
            vec![format!("-chdir={}", target.display())]
        }
    };
    let terraform = |from: &Path, args: &[&str], extra: &[&str]| -> Output {
        let mut all: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        all.push("--".into());
        all.push("terraform".into());
        all.extend(chdir(from));
        all.extend(args.iter().map(|s| (*s).to_owned()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        run(from, &tfrc, &all, !file_state)
    };
    // The store is made once, from the root, on purpose.
    for (args, extra) in [
        (&["init", "-input=false"][..], &["--new-store"][..]),
        (&["apply", "-auto-approve", "-input=false"], &[]),
    ] {
        let out = terraform(&root, args, extra);
        assert!(
            out.status.success(),
            "{args:?} (seed {seed}): {}",
            text(&out)
        );
    }
    assert_eq!(stores(tmp.path()), std::slice::from_ref(&root));

    // Every directory on the way to the configuration, and others beside it.
    let mut places = vec![root.clone()];
    places.extend(
        config
            .ancestors()
            .take_while(|d| d.starts_with(&root) && *d != root)
            .map(Path::to_path_buf),
    );
    for _ in 0..2 {
        let other = (0..rng.random_range(1..3)).fold(root.join("elsewhere"), |d, _| {
            d.join(words[rng.random_range(0..words.len())])
        });
        std::fs::create_dir_all(&other).expect("other dir");
        places.push(other);
    }
    for from in &places {
        if toml && !file_state {
            // The root file's state, for the configuration below: refused before Terraform.
            let mut all = vec!["--".to_owned(), "terraform".to_owned()];
            all.extend(chdir(from));
            all.push("plan".into());
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            let out = run(from, &tfrc, &all, false);
            let refused = text(&out);
            assert!(
                !out.status.success()
                    && refused.contains(&root.join("gitstate.toml").display().to_string())
                    && refused.contains("--state"),
                "from {} (seed {seed}): the root file's state is refused: {refused}",
                from.display()
            );
        }
        let out = terraform(from, &["plan", "-detailed-exitcode", "-input=false"], &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "from {} (seed {seed}): the plan must see the stored state: {}",
            from.display(),
            text(&out)
        );
    }
    let out = Command::new(crate::GITSTATE)
        .arg("config")
        .current_dir(places.last().expect("a place"))
        .env_remove("GITSTATE_REPOSITORY")
        .env_remove("GITSTATE_LOCAL_REPOSITORY")
        .output()
        .expect("config runs");
    let shown = text(&out);
    assert!(
        shown.contains(&root.join(".gitstate/repo.git").display().to_string())
            && shown.contains("the store found in"),
        "config from a subdirectory names the root's store: {shown}"
    );
    if toml {
        assert!(shown.contains("gitstate.toml"), "{shown}");
    }
    assert_eq!(
        stores(tmp.path()),
        std::slice::from_ref(&root),
        "seed {seed}"
    );

    // Outside the project: no store here or above, so the run refuses and creates nothing.
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    let out = run(
        &outside,
        &tfrc,
        &[
            "--state",
            STATE,
            "--",
            "terraform",
            &format!("-chdir={}", config.display()),
            "plan",
        ],
        false,
    );
    let refused = text(&out);
    assert!(!out.status.success(), "{refused}");
    assert!(
        refused.contains("a new, empty store") && refused.contains("--new-store"),
        "{refused}"
    );
    assert_eq!(
        stores(tmp.path()),
        std::slice::from_ref(&root),
        "seed {seed}"
    );
    // Told to, it starts one, and Terraform finds no state there: what the refusal prevents.
    let out = run(
        &outside,
        &tfrc,
        &[
            "--new-store",
            "--state",
            STATE,
            "--",
            "terraform",
            &format!("-chdir={}", config.display()),
            "plan",
            "-detailed-exitcode",
        ],
        false,
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(outside.join(".gitstate/repo.git").is_dir());
    eprintln!(
        "store: {} directories, one store; configuration {depth} below the root, state in \
         gitstate.toml: {toml}",
        places.len()
    );
}
