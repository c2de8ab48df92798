//! What template.yaml relies on from the function (issue 29): the failed-login metric filter
//! matches the line the Lambda really writes for a failed login, and nothing else; KMS-sealed
//! settings (the git token, the bootstrap admin's hash) made for one team do not start another
//! team's function (moto as KMS, a real git server on loopback).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use gitstate_tests::{
    GIT_TOKEN, GIT_USER, GitServer, Moto, access_file, hash_of, init_tracing, seal_setting,
};
use http_body_util::BodyExt as _;
use rand::{Rng as _, SeedableRng as _};
use tower::ServiceExt as _;

/// The `FilterPattern` of template.yaml's failed-login metric filter, as (JSON path, value): the
/// only form the template uses, `{ $.a.b = "value" }`.
fn template_filter() -> (Vec<String>, String) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml");
    let template = std::fs::read_to_string(path).expect("template.yaml");
    let line = template
        .lines()
        .find_map(|l| l.trim().strip_prefix("FilterPattern:"))
        .expect("template.yaml has a FilterPattern");
    let pattern = line.trim().trim_matches('\'');
    let inner = pattern
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .expect("a JSON filter pattern")
        .trim();
    let (selector, value) = inner.split_once(" = ").expect("one equality");
    let selector = selector.strip_prefix("$.").expect("a $. selector");
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .expect("a quoted value");
    (
        selector.split('.').map(str::to_owned).collect(),
        value.to_owned(),
    )
}

/// Whether a log line matches the filter as CloudWatch Logs evaluates a JSON equality: the line
/// is a JSON object and the selected field equals the value exactly.
fn matches(line: &str, (path, value): &(Vec<String>, String)) -> bool {
    let Ok(json) = serde_json::from_str::<serde_json::Value>(line) else {
        return false;
    };
    let mut at = &json;
    for key in path {
        match at.get(key) {
            Some(next) => at = next,
            None => return false,
        }
    }
    at.as_str() == Some(value.as_str())
}

#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lines").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn take(&self) -> Vec<String> {
        let bytes = std::mem::take(&mut *self.0.lock().expect("log lines"));
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn basic(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

async fn get(router: &axum::Router, path: &str, authorization: Option<&str>) -> (u16, String) {
    let mut request = http::Request::get(path);
    if let Some(value) = authorization {
        request = request.header(http::header::AUTHORIZATION, value);
    }
    let response = router
        .clone()
        .oneshot(request.body(axum::body::Body::empty()).expect("request"))
        .await
        .expect("router answers");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Generated logins, good and bad, through the router while the Lambda's own JSON log format
/// writes to memory: the template's filter counts exactly the refused ones.
#[tokio::test(flavor = "current_thread")]
async fn the_failed_login_filter_counts_exactly_the_failed_logins_the_lambda_logs() {
    let filter = template_filter();
    let lines = Lines::default();
    let writer = lines.clone();
    use lambda_http::tracing::subscriber::layer::SubscriberExt as _;
    let subscriber =
        lambda_http::tracing::subscriber::registry()
            .with(gitstate_app::lambda::log_format(true, move || {
                writer.clone()
            }));
    // This thread only (a current-thread runtime): the other tests' logs stay out.
    let _guard = lambda_http::tracing::subscriber::util::SubscriberInitExt::set_default(subscriber);

    let server = GitServer::start().await;
    let url = server.create_repo("deploy-logins");
    let cache = tempfile::tempdir().expect("tempdir");
    let access = access_file(&[("alice", "alice-password", &["read:*"])]);
    let router = gitstate_tests::app(&gitstate_tests::settings_for(
        &url,
        cache.path(),
        &[("GITSTATE_ACCESS", &access)],
    ))
    .await;
    lines.take();

    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let (mut failed, mut cases) = (0, 0);
    for _ in 0..12 {
        let authorization = match rng.random_range(0..5) {
            0 => Some(basic("alice", "alice-password")),
            1 => Some(basic("alice", &format!("wrong-{}", rng.random::<u32>()))),
            2 => Some(basic(
                &format!("nobody{}", rng.random::<u16>()),
                "alice-password",
            )),
            3 => None,
            _ => Some("Basic not-base64!".to_owned()),
        };
        let (status, body) = get(&router, "/states/team/a.tfstate", authorization.as_deref()).await;
        let refused_credentials = authorization.is_some() && status == 401;
        let got = lines.take();
        let counted = got.iter().filter(|l| matches(l, &filter)).count();
        // Credentials that do not verify are the failed logins; a missing or unreadable header
        // is a client that never logged in.
        let verified_and_failed = refused_credentials
            && authorization
                .as_deref()
                .is_some_and(|a| a != "Basic not-base64!");
        assert_eq!(
            counted,
            usize::from(verified_and_failed),
            "status {status} {body}: {got:#?}"
        );
        if verified_and_failed {
            failed += 1;
            let line = got.iter().find(|l| matches(l, &filter)).expect("counted");
            assert!(line.contains("\"level\":\"WARN\""), "{line}");
            assert!(!line.contains("alice-password"), "{line}");
        }
        cases += 1;
    }
    eprintln!("MEASURE failed-login filter: {cases} requests, {failed} failed logins counted");
    assert!(failed > 0, "the generated logins included no failure");
}

/// The settings a team's function reads, as template.yaml sets them.
fn lambda_settings(
    repository: &str,
    cache: &std::path::Path,
    extra: &[(&str, String)],
) -> gitstate_app::Settings {
    let mut vars: HashMap<String, String> = HashMap::from([
        ("GITSTATE_REPOSITORY".into(), repository.into()),
        ("GITSTATE_GIT_USERNAME".into(), GIT_USER.into()),
        ("GITSTATE_CACHE_DIR".into(), cache.display().to_string()),
        ("GITSTATE_GIT_TIMEOUT_SECS".into(), "10".into()),
    ]);
    for (k, v) in extra {
        vars.insert((*k).into(), v.clone());
    }
    gitstate_app::Settings::from_lookup(gitstate_app::Runtime::Lambda, |k| vars.get(k).cloned())
        .expect("settings")
}

/// A team name as the template allows it: 2-40 of [a-z0-9-], no dash at either end.
fn team_name(rng: &mut rand::rngs::StdRng) -> String {
    const INNER: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-";
    let len = rng.random_range(2..=40);
    (0..len)
        .map(|i| {
            let set = if i == 0 || i == len - 1 {
                &INNER[..36]
            } else {
                INNER
            };
            set[rng.random_range(0..set.len())] as char
        })
        .collect()
}

/// Generated pairs of teams sharing one key (the worst case: an organisation key): a git token
/// or an admin hash sealed for team A starts team A's function, which then reaches the git host
/// and logs the admin in, and stops team B's at start-up with an error naming the variable and
/// the context it expected, never the value. A token sealed without a team (the form before
/// the team was part of the context) starts no function that names its team.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_sealed_for_one_team_does_not_start_another_teams_function() {
    init_tracing();
    let moto = Moto::start().await;
    let key = moto.create_key("teams").await;
    let kms = moto.kms().await;
    let server = GitServer::start().await;
    let url = server.create_repo("deploy-teams");
    let cache = tempfile::tempdir().expect("tempdir");
    let admin_password = "admin-Pa55word-of-team-a";
    let admin_hash = hash_of(admin_password);
    let git_token = gitstate_kms::GIT_TOKEN_PURPOSE;
    let admin = gitstate_kms::ADMIN_HASH_PURPOSE;
    let team_key = gitstate_kms::TEAM_CONTEXT_KEY;

    let mut rng = rand::rngs::StdRng::seed_from_u64(2029);
    let pairs = 6;
    for round in 0..pairs {
        let a = team_name(&mut rng);
        let b = loop {
            let b = team_name(&mut rng);
            if b != a {
                break b;
            }
        };
        let token = seal_setting(&kms, &key, GIT_TOKEN, &[git_token, (team_key, &a)]).await;
        let hash = seal_setting(&kms, &key, &admin_hash, &[admin, (team_key, &a)]).await;
        let sealed = |team: &str| {
            vec![
                ("GITSTATE_TEAM", team.to_owned()),
                ("GITSTATE_GIT_TOKEN_KMS", token.clone()),
                ("GITSTATE_ADMIN_HASH_KMS", hash.clone()),
                ("GITSTATE_KMS_KEY_IDS", key.clone()),
            ]
        };

        let refused = gitstate_app::build_with(
            lambda_settings(&url, cache.path(), &sealed(&b)),
            Some(kms.clone()),
        )
        .await
        .err()
        .expect("team B's function does not start with team A's token");
        let message = gitstate_core::report::chain(&refused);
        assert!(message.contains("GITSTATE_GIT_TOKEN_KMS"), "{message}");
        assert!(message.contains(&format!("gitstate:team={b}")), "{message}");
        assert!(
            !message.contains(GIT_TOKEN) && !message.contains(&token),
            "{message}"
        );

        // Team B with its own token but team A's admin hash: refused too.
        let own_token = seal_setting(&kms, &key, GIT_TOKEN, &[git_token, (team_key, &b)]).await;
        let mut mixed = sealed(&b);
        mixed[1].1 = own_token;
        let refused = gitstate_app::build_with(
            lambda_settings(&url, cache.path(), &mixed),
            Some(kms.clone()),
        )
        .await
        .err()
        .expect("team B's function does not start with team A's admin hash");
        let message = gitstate_core::report::chain(&refused);
        assert!(message.contains("GITSTATE_ADMIN_HASH_KMS"), "{message}");

        // Team A's function starts, uses the token against the git host and knows its admin.
        let app = gitstate_app::build_with(
            lambda_settings(&url, cache.path(), &sealed(&a)),
            Some(kms.clone()),
        )
        .await
        .expect("team A's function starts");
        let router = app.router();
        let (status, body) = get(
            &router,
            &format!("/states/teams/{round}.tfstate"),
            Some(&basic("admin", admin_password)),
        )
        .await;
        assert!(
            status == 200 || status == 404,
            "the admin reads through the git host: {status} {body}"
        );
        let (status, _) = get(
            &router,
            &format!("/states/teams/{round}.tfstate"),
            Some(&basic("admin", "not-the-password")),
        )
        .await;
        assert_eq!(status, 401);
    }

    // The form before teams: no team in the context.
    let untied = seal_setting(&kms, &key, GIT_TOKEN, &[git_token]).await;
    let settings = lambda_settings(
        &url,
        cache.path(),
        &[
            ("GITSTATE_TEAM", "platform".to_owned()),
            ("GITSTATE_GIT_TOKEN_KMS", untied.clone()),
        ],
    );
    let refused = gitstate_app::build_with(settings, Some(kms.clone()))
        .await
        .err()
        .expect("a token sealed without the team is refused where the team is set");
    let message = gitstate_core::report::chain(&refused);
    assert!(message.contains("gitstate:team=platform"), "{message}");
    // Without GITSTATE_TEAM (outside the template) it still opens.
    let settings = lambda_settings(&url, cache.path(), &[("GITSTATE_GIT_TOKEN_KMS", untied)]);
    gitstate_app::build_with(settings, Some(kms.clone()))
        .await
        .expect("no team configured, no team in the context");
    eprintln!("MEASURE sealed settings: {pairs} generated team pairs, each refused across teams");
}
