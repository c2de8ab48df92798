//! The release files, run for real: `infra/release/package` packs this build's binary as a release
//! does, `infra/release/install.sh` (what the action runs) installs it from a loopback HTTP server
//! (Python's `http.server`), and `infra/container/assemble` lays out the image's files. The
//! workflow and the action's metadata are linted by `tests/check-release`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// This machine's release target, as install.sh names it.
fn host_target() -> &'static str {
    match (std::env::consts::OS, std::env::consts::ARCH) {
        ("linux", "x86_64") => "x86_64-unknown-linux-gnu",
        ("linux", "aarch64") => "aarch64-unknown-linux-gnu",
        ("macos", "x86_64") => "x86_64-apple-darwin",
        ("macos", "aarch64") => "aarch64-apple-darwin",
        other => panic!("no release target for {other:?}"),
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .expect("the script starts")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn package(out: &Path, binary: &Path) -> Output {
    run(Command::new("bash")
        .arg(root().join("infra/release/package"))
        .arg(out)
        .arg(format!("{}={}", host_target(), binary.display())))
}

/// This build's binary without its debug information, as the release profile strips it (the
/// debug build is about five times larger, and packing it would only slow the test).
fn stripped(dir: &Path) -> PathBuf {
    let binary = dir.join("gitstate");
    std::fs::copy(crate::GITSTATE, &binary).expect("copy the binary");
    let out = run(Command::new("strip").arg(&binary));
    assert!(out.status.success(), "strip: {}", text(&out.stderr));
    binary
}

/// `python3 -m http.server` on a free loopback port, serving `dir`; killed on drop.
struct Files {
    child: Child,
    url: String,
}

impl Files {
    fn serve(dir: &Path) -> Files {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "http.server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Files {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// install.sh with a clean environment: only what is given, plus PATH and HOME.
fn install(dir: &Path, vars: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg(root().join("infra/release/install.sh"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("GITSTATE_INSTALL_DIR", dir.join("bin"));
    for (name, value) in vars {
        cmd.env(name, value);
    }
    run(&mut cmd)
}

fn version_of(binary: &Path) -> String {
    let out = run(Command::new(binary).arg("--version"));
    assert!(
        out.status.success(),
        "{binary:?} --version: {}",
        text(&out.stderr)
    );
    text(&out.stdout).trim().to_owned()
}

/// A way to spoil a release: what it is, what it does to the release's folder, and the settings
/// install.sh then runs with.
type Case = (String, Box<dyn Fn(&Path)>, Vec<(&'static str, String)>);

#[test]
fn packaged_releases_install_only_when_their_checksum_holds() {
    let work = tempfile::tempdir().expect("tempdir");
    let release = work.path().join("release");
    let binary = stripped(work.path());
    let packed = package(&release, &binary);
    assert!(packed.status.success(), "package: {}", text(&packed.stderr));
    let archive = format!("gitstate-{}.tar.gz", host_target());
    let sums = std::fs::read_to_string(release.join("SHA256SUMS")).expect("SHA256SUMS");
    assert!(
        sums.lines()
            .any(|line| line.ends_with(&format!("  {archive}"))),
        "{sums}"
    );
    let good = std::fs::read(release.join(&archive)).expect("archive");

    // Reproducible: packing the same binary again gives the same bytes.
    let again = work.path().join("again");
    assert!(package(&again, &binary).status.success());
    assert_eq!(std::fs::read(again.join(&archive)).expect("archive"), good);

    let files = Files::serve(&release);
    let expected = version_of(Path::new(crate::GITSTATE));
    let home = work.path().join("home");
    let installed = install(
        &home,
        &[
            ("GITSTATE_RELEASE_URL", &files.url),
            ("GITSTATE_VERSION", "v0.1.0"),
        ],
    );
    assert!(
        installed.status.success(),
        "install: {}",
        text(&installed.stderr)
    );
    let binary = home.join("bin/gitstate");
    assert_eq!(version_of(&binary), expected);
    assert_eq!(
        std::fs::read(&binary).ok(),
        std::fs::read(work.path().join("gitstate")).ok()
    );
    let said = text(&installed.stdout);
    assert!(said.contains(&format!("installed {expected}")), "{said}");
    assert!(said.contains("is not on PATH"), "the PATH hint: {said}");
    let before = std::fs::read(&binary).expect("installed");

    // Every kind of bad release or bad request fails, says why, and leaves the installed binary as
    // it was. Corruptions are generated: a flipped byte anywhere in the archive.
    let seed = rand::rng().random::<u64>();
    println!("GITSTATE_TEST_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(
        std::env::var("GITSTATE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(seed),
    );
    let mut cases: Vec<Case> = Vec::new();
    for _ in 0..6 {
        let at = rng.random_range(0..good.len());
        let bit = 1u8 << rng.random_range(0..8);
        let archive = archive.clone();
        cases.push((
            format!("bit {bit} of byte {at} flipped"),
            Box::new(move |dir: &Path| {
                let mut bytes = std::fs::read(dir.join(&archive)).expect("archive");
                bytes[at] ^= bit;
                std::fs::write(dir.join(&archive), bytes).expect("write");
            }),
            vec![],
        ));
    }
    // A well-formed archive with other contents (what a tampered release looks like: gzip's own
    // check passes, only SHA256SUMS can tell).
    let impostor = work.path().join("impostor");
    std::fs::create_dir(&impostor).expect("dir");
    let fake = impostor.join("gitstate");
    std::fs::write(&fake, "#!/bin/sh\necho gitstate 9.9.9\n").expect("write");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let packed = package(&impostor.join("out"), &fake);
    assert!(packed.status.success(), "{}", text(&packed.stderr));
    let (swapped, name) = (impostor.join("out").join(&archive), archive.clone());
    cases.push((
        "a well-formed archive of another binary".into(),
        Box::new(move |dir: &Path| {
            std::fs::copy(&swapped, dir.join(&name)).expect("swap");
        }),
        vec![],
    ));
    let no_entry = archive.clone();
    cases.push((
        "SHA256SUMS without the archive".into(),
        Box::new(move |dir: &Path| {
            let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).expect("sums");
            let kept: String = sums
                .lines()
                .filter(|line| !line.ends_with(&no_entry))
                .map(|line| format!("{line}\n"))
                .collect();
            std::fs::write(dir.join("SHA256SUMS"), kept).expect("write");
        }),
        vec![],
    ));
    let gone = archive.clone();
    cases.push((
        "the archive missing".into(),
        Box::new(move |dir: &Path| std::fs::remove_file(dir.join(&gone)).expect("rm")),
        vec![],
    ));
    cases.push((
        "SHA256SUMS missing".into(),
        Box::new(|dir: &Path| std::fs::remove_file(dir.join("SHA256SUMS")).expect("rm")),
        vec![],
    ));
    let unchanged = |_: &Path| {};
    cases.push((
        "an unknown target".into(),
        Box::new(unchanged),
        vec![("GITSTATE_TARGET", "riscv64gc-unknown-linux-gnu".into())],
    ));
    cases.push((
        "a version that is not a tag".into(),
        Box::new(unchanged),
        vec![("GITSTATE_VERSION", "0.1".into())],
    ));

    for (what, spoil, vars) in &cases {
        let dir = work.path().join("spoilt");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("dir");
        for name in ["SHA256SUMS", archive.as_str()] {
            std::fs::copy(release.join(name), dir.join(name)).expect("copy");
        }
        spoil(&dir);
        let spoilt = Files::serve(&dir);
        let mut all: Vec<(&str, &str)> = vec![("GITSTATE_RELEASE_URL", spoilt.url.as_str())];
        all.extend(vars.iter().map(|(name, value)| (*name, value.as_str())));
        let out = install(&home, &all);
        let reason = text(&out.stderr);
        assert!(!out.status.success(), "{what}: installed anyway");
        assert!(reason.starts_with("gitstate install: "), "{what}: {reason}");
        assert_eq!(
            reason.trim_end().lines().count(),
            1,
            "{what}: one line: {reason}"
        );
        assert_eq!(
            std::fs::read(&binary).expect("kept"),
            before,
            "{what}: binary changed"
        );
        let strays: Vec<_> = std::fs::read_dir(home.join("bin"))
            .expect("bin")
            .map(|entry| entry.expect("entry").file_name())
            .filter(|name| name != "gitstate")
            .collect();
        assert!(strays.is_empty(), "{what}: left {strays:?}");
    }
    println!("{} failure cases refused", cases.len());

    // Without a mirror, the repository must be named: no guessing whose releases to trust.
    let out = install(&home, &[]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("GITSTATE_REPO"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_container_files_hold_a_binary_that_runs() {
    let work = tempfile::tempdir().expect("tempdir");
    let rootfs = work.path().join("rootfs-amd64");
    let assemble = |dir: &Path| {
        run(Command::new("bash")
            .arg(root().join("infra/container/assemble"))
            .arg(dir)
            .arg(crate::GITSTATE))
    };
    let out = assemble(&rootfs);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let binary = rootfs.join("usr/local/bin/gitstate");
    assert_eq!(version_of(&binary), version_of(Path::new(crate::GITSTATE)));
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).expect("meta").permissions().mode() & 0o7777;
    assert_eq!(mode(&binary), 0o755);
    assert_eq!(mode(&rootfs.join("var/lib/gitstate")), 0o750);
    // The Containerfile's working directory and volume are the folder assemble made.
    let containerfile =
        std::fs::read_to_string(root().join("infra/container/Containerfile")).expect("read");
    assert!(containerfile.contains("WORKDIR /var/lib/gitstate"));
    assert!(containerfile.contains("COPY --chown=65532:65532 dist/rootfs-${TARGETARCH}/ /"));
    assert!(containerfile.contains("ENTRYPOINT [\"/usr/local/bin/gitstate\"]"));

    // Assembling into a folder that holds something is refused, and changes nothing.
    let again = assemble(&rootfs);
    assert!(!again.status.success());
    assert!(text(&again.stderr).contains("is not empty"));
}
