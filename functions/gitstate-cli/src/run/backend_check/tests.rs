use super::*;
use rand::{Rng, SeedableRng};

fn words(text: &str) -> Vec<String> {
    shlex::split(text).expect("words")
}

fn no_env(_: &str) -> Option<String> {
    None
}

/// A directory holding `files` (name, text).
fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    dir
}

fn prove_in(dir: &Path, program: &str, env: &[(&str, &str)]) -> anyhow::Result<Proof> {
    let root = dir.to_str().expect("utf-8");
    let program: Vec<String> = words(&format!("env -C {root} {program}"))
        .into_iter()
        .map(|w| w.replace('@', root))
        .collect();
    let lookup = |name: &str| {
        env.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| (*v).to_owned())
    };
    prove(&program, None, &lookup)
}

/// Generated chains of launchers around `terraform -chdir=DIR plan`: the directory found is
/// always DIR (with `env -C` joined in front), and the run's own file is added there.
#[test]
fn launchers_in_any_order_lead_to_terraforms_directory() {
    let seed = rand::random::<u64>();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = dir_with(&[("a/b/main.tf", "resource \"terraform_data\" \"x\" {}\n")]);
    let root = dir.path().to_str().expect("utf-8");
    for _ in 0..200 {
        let mut command = format!("terraform -chdir={root}/a/b plan");
        for _ in 0..rng.random_range(0..4) {
            command = match rng.random_range(0..7) {
                0 => format!("env FOO=bar {command}"),
                1 => format!("timeout -k 5 60 {command}"),
                2 => format!("nice -n 5 {command}"),
                3 => format!("nohup {command}"),
                4 if !command.contains('\'') => format!("sh -c '{command}'"),
                5 => format!("time -p {command}"),
                _ => format!("/usr/bin/env -u OTHER {command}"),
            };
        }
        let proof =
            prove(&words(&command), None, &no_env).unwrap_or_else(|e| panic!("{command}: {e:#}"));
        assert_eq!(proof.dir, Path::new(root).join("a/b"), "{command}");
        assert!(proof.add_file, "{command}");
    }
    // env -C moves the start; -chdir is then relative to it.
    let proof = prove(
        &words(&format!("env -C {root}/a terraform -chdir=b plan")),
        None,
        &no_env,
    )
    .expect("env -C");
    assert_eq!(proof.dir, Path::new(root).join("a/b"));
}

#[test]
fn programs_and_scripts_it_cannot_read_are_refused() {
    let dir = dir_with(&[("main.tf", "")]);
    for program in [
        "make plan",
        "./deploy.sh",
        "sh -c 'cd infra && terraform plan'",
        "bash -c 'terraform plan; terraform apply'",
        "sh -c 'terraform -chdir=$DIR plan'",
        "sh -c 'cd @ ; terraform plan'",
        "env -i terraform plan",
        "env -u TF_HTTP_ADDRESS terraform plan",
        "env --frobnicate terraform plan",
        "sh script.sh",
    ] {
        let e = prove_in(dir.path(), program, &[]).expect_err(program);
        let text = format!("{e:#}");
        assert!(
            text.contains("cannot tell")
                || text.contains("TF_HTTP_")
                || text.contains("refusing to guess")
                || text.contains("cd"),
            "{program}: {text}"
        );
    }
    // With --workdir the program is trusted to run there, and the directory is still checked.
    let proof = prove(&words("make plan"), Some(dir.path()), &no_env).expect("workdir");
    assert_eq!(proof.dir, dir.path());
    let bad = dir_with(&[("b.tf", "terraform {\n  backend \"s3\" {}\n}\n")]);
    assert!(prove(&words("make plan"), Some(bad.path()), &no_env).is_err());
}

/// Each foreign backend, in each file kind, is refused naming its file and line.
#[test]
fn other_backends_are_named_with_file_and_line() {
    for (name, text, line) in [
        ("b.tf", "\n\nterraform {\n  backend \"s3\" {}\n}\n", 4),
        (
            "b_override.tf",
            "terraform {\n  backend \"local\" {\n  }\n}\n",
            2,
        ),
        (
            "override.tf",
            "terraform {\n cloud {\n organization = \"x\"\n }\n}\n",
            2,
        ),
        (
            "b.tf.json",
            "{\"terraform\": {\n\"backend\": {\n\"gcs\": {}}}}",
            3,
        ),
        ("b.tofu", "terraform {\n  backend \"pg\" {}\n}\n", 2),
        (
            "h.tf",
            "terraform {\n  backend \"http\" {\n    address = \"https://elsewhere/x\"\n  }\n}\n",
            3,
        ),
        (
            "h.tf.json",
            "{\"terraform\": {\"backend\": {\"http\": {\n\"username\": \"u\"}}}}",
            2,
        ),
        (GENERATED_FILE, "# mine\n", 1),
        (GENERATED_FILE, "terraform {\n  backend \"http\" {}\n}\n", 1),
    ] {
        let dir = dir_with(&[("main.tf", ""), (name, text)]);
        let e = prove_in(dir.path(), "terraform plan", &[]).expect_err(name);
        let text = format!("{e:#}");
        assert!(text.contains(&format!("{name}:{line}:")), "{name}: {text}");
    }
    // Comments, strings and look-alike blocks are no backend.
    let dir = dir_with(&[(
        "main.tf",
        "# backend \"s3\" {}\n/* terraform { backend \"gcs\" {} } */\nlocals { x = \"backend \\\"s3\\\"\" }\n\
         resource \"terraform_data\" \"backend\" {}\nvariable \"cloud\" {}\n",
    )]);
    assert!(
        prove_in(dir.path(), "terraform plan", &[])
            .expect("no backend")
            .add_file
    );
    // A user's http block that leaves the address to the run is used as it is.
    let dir = dir_with(&[(
        "b.tf",
        "terraform {\n  backend \"http\" {\n    retry_max = 3\n  }\n}\n",
    )]);
    assert!(
        !prove_in(dir.path(), "terraform plan", &[])
            .expect("http")
            .add_file
    );
    // Another run's file, byte for byte, is not foreign.
    let dir = dir_with(&[(GENERATED_FILE, GENERATED)]);
    assert!(
        prove_in(dir.path(), "terraform plan", &[])
            .expect("ours")
            .add_file
    );
    // A file that does not parse is not guessed at.
    let dir = dir_with(&[("main.tf", "terraform {\n")]);
    assert!(prove_in(dir.path(), "terraform plan", &[]).is_err());
}

#[test]
fn cli_arguments_that_skip_or_redirect_the_backend_are_refused() {
    let dir = dir_with(&[
        ("main.tf", ""),
        ("gs.hcl", "retry_max = 2\naddress = \"https://x/y\"\n"),
        ("ok.hcl", "retry_max = 2\n"),
    ]);
    for (program, env, needle) in [
        ("terraform init -backend=false", vec![], "-backend=false"),
        (
            "terraform init",
            vec![("TF_CLI_ARGS_init", "-backend=false")],
            "TF_CLI_ARGS_init",
        ),
        (
            "terraform init",
            vec![("TF_CLI_ARGS", "-backend-config=address=https://x")],
            "TF_CLI_ARGS",
        ),
        ("terraform init -backend-config gs.hcl", vec![], "gs.hcl:2:"),
        (
            "env TF_CLI_ARGS_init=-backend-config=password=x terraform init",
            vec![],
            "password",
        ),
        (
            "terraform init -backend-config=lock_address=x",
            vec![],
            "lock_address",
        ),
    ] {
        let e = prove_in(dir.path(), program, &env).expect_err(program);
        let text = format!("{e:#}");
        assert!(text.contains(needle), "{program} {env:?}: {text}");
    }
    for (program, env) in [
        ("terraform init -backend-config=ok.hcl", vec![]),
        ("terraform init -backend-config=retry_max=4", vec![]),
        (
            "terraform plan",
            vec![("TF_CLI_ARGS_init", "-backend=false")],
        ),
        ("terraform init -backend=true", vec![]),
    ] {
        prove_in(dir.path(), program, &env).unwrap_or_else(|e| panic!("{program}: {e:#}"));
    }
}

#[test]
fn a_data_dir_initialised_elsewhere_is_refused_unless_reinitialised() {
    let saved = |kind: &str, config: &str| {
        format!(
            "{{\"version\": 3, \"backend\": {{\"type\": \"{kind}\", \"config\": {config}, \"hash\": 1}}}}"
        )
    };
    let own = saved("http", "{\"address\": null, \"retry_max\": 2}");
    let s3 = saved("s3", "{\"bucket\": \"b\"}");
    let elsewhere = saved("http", "{\"address\": \"https://elsewhere/x\"}");
    for (text, ok) in [
        (own.as_str(), true),
        (s3.as_str(), false),
        (elsewhere.as_str(), false),
    ] {
        let dir = dir_with(&[("main.tf", ""), (".terraform/terraform.tfstate", text)]);
        assert_eq!(
            prove_in(dir.path(), "terraform plan", &[]).is_ok(),
            ok,
            "{text}"
        );
        prove_in(dir.path(), "terraform init -reconfigure", &[]).expect("reconfigure");
        prove_in(dir.path(), "terraform init -migrate-state -force-copy", &[]).expect("migrate");
        // TF_DATA_DIR moves it.
        let moved = dir_with(&[("main.tf", ""), ("data/terraform.tfstate", text)]);
        assert_eq!(
            prove_in(moved.path(), "terraform plan", &[("TF_DATA_DIR", "data")]).is_ok(),
            ok
        );
    }
}
