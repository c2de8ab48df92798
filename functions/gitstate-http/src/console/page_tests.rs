//! The console's pages rendered through the router over the in-memory store: operation names,
//! restores, the compact view's counts against a model of generated histories, the backend
//! block, and error pages for browsers only.

use std::collections::BTreeMap;

use axum::body::Body;
use gitstate_core::wording;
use http::{StatusCode, header};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::tests::{Answer, app, call, send};
use crate::{SCHEME_HEADER, backend_block};

fn text(answer: &Answer) -> String {
    String::from_utf8_lossy(&answer.body).into_owned()
}

/// `s` as the templates escape it.
fn escaped(s: &str) -> String {
    s.replace('&', "&#38;")
        .replace('<', "&#60;")
        .replace('>', "&#62;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

/// Lock `name` with `operation`, write `body` under the lock, release it.
async fn write_as(router: &axum::Router, name: &str, operation: &str, body: &str) {
    let id = format!("id-{}", rand::random::<u32>());
    let info = json!({"ID": id, "Operation": operation, "Who": "ann@host"}).to_string();
    let uri = format!("/states/{name}");
    let locked = call(router, "LOCK", &uri, "ann", info.clone()).await;
    assert_eq!(locked.status, StatusCode::OK, "{}", text(&locked));
    let written = call(
        router,
        "POST",
        &format!("{uri}?ID={id}"),
        "ann",
        body.to_owned(),
    )
    .await;
    assert_eq!(written.status, StatusCode::OK, "{}", text(&written));
    let unlocked = call(router, "UNLOCK", &uri, "ann", info).await;
    assert_eq!(unlocked.status, StatusCode::OK);
}

fn state(serial: u64, resources: &BTreeMap<String, u32>) -> String {
    let resources: Vec<_> = resources
        .iter()
        .map(|(name, value)| {
            json!({"mode": "managed", "type": "null_resource", "name": name,
                   "instances": [{"attributes": {"id": value}}]})
        })
        .collect();
    json!({"version": 4, "serial": serial, "lineage": "l", "resources": resources}).to_string()
}

async fn page(router: &axum::Router, uri: &str) -> String {
    let answer = call(router, "GET", uri, "ann", "").await;
    assert_eq!(answer.status, StatusCode::OK, "{uri}: {}", text(&answer));
    text(&answer)
}

/// Every operation value Terraform and OpenTofu send, gitstate's own, and generated ones: the
/// list, the state's versions (cards and compact) and a held lock show the words a person
/// reads, with what was sent only in the title.
#[tokio::test]
async fn operations_are_shown_as_words() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(250);
    let mut values: Vec<String> = [
        "OperationTypeApply",
        "OperationTypePlan",
        "OperationTypeRefresh",
        "OperationTypeInvalid",
        "state-push",
        "state-mv",
        "state-rm",
        "migration destination state",
        "migration source state",
        "taint",
        "untaint",
        "",
    ]
    .map(str::to_owned)
    .to_vec();
    for _ in 0..20 {
        let word: String = (0..rng.random_range(1..12))
            .map(|_| ['a', 'Q', '-', ' ', '<', '&', '"', 'é'][rng.random_range(0..8)])
            .collect();
        values.push(if rng.random_bool(0.5) {
            format!("OperationType{word}")
        } else {
            word
        });
    }
    let router = app();
    for (i, sent) in values.iter().enumerate() {
        let name = format!("ops/s{i}.tfstate");
        write_as(&router, &name, sent, &state(1, &BTreeMap::new())).await;
        // What the commit records: the lock's operation on one line, or else the first word
        // of its subject.
        let recorded = match sent.trim() {
            "" => "write",
            text => text,
        };
        let shown = escaped(&wording::operation(recorded));
        let title = format!(" title=\"{}\">{shown}<", escaped(recorded));
        let cards = page(&router, &format!("/ui/states/{name}")).await;
        assert!(cards.contains(&title), "{sent:?} → {shown}: {cards}");
        let compact = page(&router, &format!("/ui/states/{name}?view=compact")).await;
        assert!(compact.contains(&title), "{sent:?}: {compact}");
        let list = page(&router, &format!("/ui/?q=s{i}.tfstate")).await;
        assert!(list.contains(&title), "{sent:?}: {list}");
        // Held: the lock's operation too.
        let info = json!({"ID": "held", "Operation": sent, "Who": "w@h"}).to_string();
        let uri = format!("/states/{name}");
        assert_eq!(
            call(&router, "LOCK", &uri, "ann", info.clone())
                .await
                .status,
            StatusCode::OK
        );
        let held = page(&router, &format!("/ui/states/{name}")).await;
        let lock_title = format!(
            "<dd title=\"{}\">{}<",
            escaped(sent),
            escaped(&wording::operation(sent))
        );
        assert!(held.contains(&lock_title), "{sent:?}: {held}");
        assert_eq!(
            call(&router, "UNLOCK", &uri, "ann", info).await.status,
            StatusCode::OK
        );
        for html in [&cards, &compact, &list, &held] {
            let visible = html
                .replace(&format!("\"{}\"", escaped(sent)), "")
                .replace(&format!("\"{}\"", escaped(recorded)), "");
            assert!(
                !visible.contains(">OperationType"),
                "{sent:?} shown raw: {html}"
            );
        }
    }
}

/// The version list after a restore names what was restored, in both views.
#[tokio::test]
async fn a_restore_names_the_version_it_restored() {
    let router = app();
    let name = "r/app.tfstate";
    for serial in 1..=3 {
        let resources = BTreeMap::from([(format!("n{serial}"), serial as u32)]);
        write_as(
            &router,
            name,
            "OperationTypeApply",
            &state(serial, &resources),
        )
        .await;
    }
    let history = call(&router, "GET", &format!("/history/{name}"), "ann", "").await;
    let versions: serde_json::Value = serde_json::from_slice(&history.body).expect("JSON");
    let first = versions["versions"][2]["version"]
        .as_str()
        .expect("id")
        .to_owned();
    let restored = call(
        &router,
        "POST",
        &format!("/history/{name}?restore=1"),
        "ann",
        "",
    )
    .await;
    assert_eq!(restored.status, StatusCode::OK, "{}", text(&restored));
    let short: String = first.chars().take(10).collect();
    let cards = page(&router, &format!("/ui/states/{name}")).await;
    assert!(
        cards.contains(&format!(
            "<p class=\"restored\">Restored from <a href=\"#v-{first}\">serial 1</a>, version <code title=\"{first}\">{short}</code>.</p>"
        )),
        "{cards}"
    );
    assert_eq!(cards.matches("class=\"restored\"").count(), 1, "{cards}");
    assert!(cards.contains(">restore</span>"), "{cards}");
    let compact = page(&router, &format!("/ui/states/{name}?view=compact")).await;
    assert!(
        compact.contains(">restore</span> <span class=\"restored\">of serial 1</span>"),
        "{compact}"
    );
    // Serial 1 off the page: the version ID alone names it.
    let newest = page(&router, &format!("/ui/states/{name}?per_page=1")).await;
    assert!(
        newest.contains(&format!(
            "Restored from version <code title=\"{first}\">{short}</code>."
        )),
        "{newest}"
    );
}

/// The numbers of the cells of `class` in the compact table, top to bottom.
fn column(html: &str, class: &str) -> Vec<Option<usize>> {
    let marker = format!("class=\"num {class}\"");
    html.match_indices(&marker)
        .map(|(at, _)| {
            let rest = &html[at..];
            let start = rest.find('>').expect("cell") + 1;
            let end = rest.find("</td>").expect("cell end");
            rest[start..end].parse().ok()
        })
        .collect()
}

/// Generated histories (resources added, changed and removed at random, some versions not
/// Terraform states at all): the compact view's counts are those of a model of each step.
#[tokio::test]
async fn the_compact_view_counts_what_each_version_changed() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2503);
    let router = app();
    for history in 0..12 {
        let name = format!("h/{history}.tfstate");
        let mut current: BTreeMap<String, u32> = BTreeMap::new();
        // (added, changed, removed) of each version, oldest first; `None`: not a state.
        let mut model: Vec<Option<(usize, usize, usize)>> = Vec::new();
        let mut readable_before = true;
        for serial in 1..=rng.random_range(1..12_u64) {
            if rng.random_bool(0.1) {
                // Client-side encrypted (OpenTofu): neither it nor the next can be compared.
                let body = json!({"serial": serial, "lineage": "l", "encrypted_data": "x"});
                write_as(&router, &name, "OperationTypeApply", &body.to_string()).await;
                model.push(None);
                readable_before = false;
                continue;
            }
            let mut next = current.clone();
            let (mut added, mut changed, mut removed) = (0, 0, 0);
            for key in current.keys() {
                match rng.random_range(0..4) {
                    0 => {
                        next.remove(key);
                        removed += 1;
                    }
                    1 => {
                        next.insert(key.clone(), rng.random());
                        changed += 1;
                    }
                    _ => {}
                }
            }
            for _ in 0..rng.random_range(0..4) {
                let key = format!("r{}", rng.random_range(0..1000));
                if !current.contains_key(&key) && next.insert(key, rng.random()).is_none() {
                    added += 1;
                }
            }
            write_as(&router, &name, "OperationTypeApply", &state(serial, &next)).await;
            model.push(readable_before.then_some((added, changed, removed)));
            readable_before = true;
            current = next;
        }
        let html = page(
            &router,
            &format!("/ui/states/{name}?view=compact&per_page=100"),
        )
        .await;
        let shown: Vec<Option<(usize, usize, usize)>> = column(&html, "added-count")
            .into_iter()
            .zip(column(&html, "changed-count"))
            .zip(column(&html, "removed-count"))
            .map(|((a, c), r)| Some((a?, c?, r?)))
            .collect();
        model.reverse();
        assert_eq!(shown, model, "{name}: {html}");
        assert!(
            !html.contains("<ol class=\"versions\">"),
            "one row a version"
        );
    }
}

#[tokio::test]
async fn an_unknown_view_is_refused() {
    let router = app();
    write_as(
        &router,
        "v/a.tfstate",
        "OperationTypeApply",
        &state(1, &BTreeMap::new()),
    )
    .await;
    let answer = call(
        &router,
        "GET",
        "/ui/states/v/a.tfstate?view=grid",
        "ann",
        "",
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(text(&answer).contains("\"compact\""), "{}", text(&answer));
}

/// The block names the address the browser used (scheme set by the server, `Host` as sent,
/// anything but a host refused), and the branch of a `?ref=` page.
#[tokio::test]
async fn the_backend_block_points_at_the_state_shown() {
    let router = app();
    let name = "b/net.tfstate";
    write_as(
        &router,
        name,
        "OperationTypeApply",
        &state(1, &BTreeMap::new()),
    )
    .await;
    for (host, scheme, query, base, branch) in [
        (
            "gitstate.example:8443",
            "https",
            "",
            "https://gitstate.example:8443",
            None,
        ),
        ("127.0.0.1:8080", "http", "", "http://127.0.0.1:8080", None),
        (
            "[::1]:9",
            "http",
            "?ref=main",
            "http://[::1]:9",
            Some("main"),
        ),
        ("evil\"host", "http", "", "http://localhost", None),
    ] {
        let request = http::Request::builder()
            .uri(format!("/ui/states/{name}{query}"))
            .header(header::HOST, host)
            .header(SCHEME_HEADER, scheme);
        let answer = send(&router, request, Some("ann"), Body::empty()).await;
        let html = text(&answer);
        let block = escaped(&backend_block::backend_block(base, name, branch));
        assert!(
            html.contains(&format!(
                "<pre class=\"copy\" id=\"backend-block\" tabindex=\"0\"><code>{block}</code></pre>"
            )),
            "{host}: {html}"
        );
    }
    let mut cli = Vec::new();
    crate::write_backend_block(&mut cli, "http://h", name).expect("write");
    assert_eq!(
        String::from_utf8(cli).expect("utf-8").trim(),
        backend_block::backend_block("http://h", name, None),
        "the CLI prints the same block"
    );
}

fn as_browser(uri: &str) -> http::request::Builder {
    http::Request::builder()
        .uri(uri)
        .header(header::ACCEPT, "text/html,application/xhtml+xml,*/*;q=0.8")
}

/// For each refusal a browser can meet, on console and API addresses: a styled page with the
/// reason and a link back, the same status and headers; any other client's answer unchanged.
#[tokio::test]
async fn browsers_get_error_pages_and_other_clients_their_answers() {
    let router = app();
    write_as(
        &router,
        "team/a.tfstate",
        "OperationTypeApply",
        &state(1, &BTreeMap::new()),
    )
    .await;
    write_as(
        &router,
        "other/b.tfstate",
        "OperationTypeApply",
        &state(1, &BTreeMap::new()),
    )
    .await;
    for (method, uri, user, browser_status, client_status) in [
        ("GET", "/ui/states/none.tfstate", "ann", 404, 400),
        ("GET", "/ui/elsewhere", "ann", 404, 400),
        ("GET", "/ui/states/other/b.tfstate", "wes", 403, 403),
        ("GET", "/states/other/b.tfstate", "wes", 403, 403),
        ("GET", "/states/none.tfstate", "ann", 404, 404),
        ("GET", "/history/team/a.tfstate?at=99", "ann", 400, 400),
        ("DELETE", "/ui/", "ann", 405, 405),
    ] {
        let method = http::Method::from_bytes(method.as_bytes()).expect("method");
        let request = as_browser(uri).method(method.clone());
        let page = send(&router, request, Some(user), Body::empty()).await;
        assert_eq!(page.status.as_u16(), browser_status, "{uri}");
        assert_eq!(
            page.headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("text/html; charset=utf-8"),
            "{uri}"
        );
        let html = text(&page);
        assert!(
            html.contains("<a href=\"/ui/\" id=\"back\">"),
            "{uri}: {html}"
        );
        assert!(html.contains("<link rel=\"stylesheet\" href=\"/ui/style.css\">"));
        assert!(html.contains(&format!("Error {browser_status}")), "{html}");
        assert!(page.headers.contains_key(header::CONTENT_SECURITY_POLICY));
        if browser_status == 405 {
            assert!(page.headers.contains_key(header::ALLOW));
        }
        let plain = call(&router, method.as_str(), uri, user, "").await;
        assert_eq!(plain.status.as_u16(), client_status, "{uri}");
        let body = text(&plain);
        assert_eq!(
            plain
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("text/plain; charset=utf-8"),
            "{uri}"
        );
        assert_eq!(body.lines().count(), 1, "{uri}: one line");
        if browser_status == client_status {
            assert!(
                html.contains(&escaped(body.trim())),
                "the page says why: {html}"
            );
        }
    }
    // Statuses that are no refusal, and a 401 (the browser asks for credentials), stay as
    // they are for browsers too.
    let unauthenticated = send(&router, as_browser("/ui/"), None, Body::empty()).await;
    assert_eq!(unauthenticated.status, StatusCode::UNAUTHORIZED);
    assert!(!text(&unauthenticated).contains("<html"));
    let state = send(
        &router,
        as_browser("/states/team/a.tfstate"),
        Some("ann"),
        Body::empty(),
    )
    .await;
    assert_eq!(state.status, StatusCode::OK);
    assert!(text(&state).starts_with('{'));
}

/// A download is the history's `?at=` read as an attachment: the same bytes and version for
/// every version of generated histories, by commit id or serial, on the default branch or a
/// named one; refused like any read (no grant, an unknown version, no `?at=`).
#[tokio::test]
async fn downloads_are_the_history_read_as_a_file() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2504);
    let router = app();
    for round in 0..6 {
        let name = format!("team/d{round}.tfstate");
        let mut resources = BTreeMap::new();
        for serial in 1..=rng.random_range(1..6_u64) {
            resources.insert(format!("r{}", rng.random_range(0..20)), rng.random());
            write_as(
                &router,
                &name,
                "OperationTypeApply",
                &state(serial, &resources),
            )
            .await;
        }
        let page = page(&router, &format!("/ui/states/{name}?view=compact")).await;
        let history = call(&router, "GET", &format!("/history/{name}"), "rita", "").await;
        let listed: serde_json::Value = serde_json::from_slice(&history.body).expect("JSON");
        for v in listed["versions"].as_array().expect("versions") {
            let id = v["version"].as_str().expect("id");
            let serial = v["serial"].as_u64().expect("serial");
            let href = format!("/ui/download/{name}?at={id}");
            assert!(
                page.contains(&format!("href=\"{href}\" download>")),
                "{page}"
            );
            let via_history = call(
                &router,
                "GET",
                &format!("/history/{name}?at={serial}"),
                "rita",
                "",
            )
            .await;
            // The in-memory store's version IDs are small numbers, which `?at=` reads as
            // serials: a commit ID is selected only where it is one (the browser test).
            let mut selectors = vec![serial.to_string()];
            if id.len() == 40 {
                selectors.push(id.to_owned());
            }
            let branch = ["", "&ref=main"][rng.random_range(0..2)];
            for selector in selectors {
                let uri = format!("/ui/download/{name}?at={selector}{branch}");
                let file = call(&router, "GET", &uri, "rita", "").await;
                assert_eq!(file.status, StatusCode::OK, "{uri}: {}", text(&file));
                assert_eq!(file.body, via_history.body, "{uri}");
                let stem = format!("d{round}-serial-{serial}.tfstate");
                assert_eq!(
                    file.headers
                        .get(header::CONTENT_DISPOSITION)
                        .and_then(|v| v.to_str().ok()),
                    Some(format!("attachment; filename=\"{stem}\"").as_str())
                );
                assert_eq!(
                    file.headers
                        .get(header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok()),
                    Some("application/json")
                );
                assert_eq!(
                    file.headers
                        .get("gitstate-version")
                        .and_then(|v| v.to_str().ok()),
                    Some(id)
                );
            }
        }
    }
    write_as(
        &router,
        "other/secret.tfstate",
        "OperationTypeApply",
        &state(1, &BTreeMap::new()),
    )
    .await;
    for (uri, user, status) in [
        (
            "/ui/download/other/secret.tfstate?at=1",
            "wes",
            StatusCode::FORBIDDEN,
        ),
        (
            "/ui/download/team/d0.tfstate?at=99",
            "rita",
            StatusCode::BAD_REQUEST,
        ),
        (
            "/ui/download/team/d0.tfstate?at=nope",
            "rita",
            StatusCode::BAD_REQUEST,
        ),
        (
            "/ui/download/team/d0.tfstate",
            "rita",
            StatusCode::BAD_REQUEST,
        ),
        (
            "/ui/download/team/missing.tfstate?at=1",
            "rita",
            StatusCode::BAD_REQUEST,
        ),
        ("/ui/download/../x?at=1", "rita", StatusCode::BAD_REQUEST),
    ] {
        let answer = call(&router, "GET", uri, user, "").await;
        assert_eq!(answer.status, status, "{uri}: {}", text(&answer));
        assert!(
            answer.headers.get(header::CONTENT_DISPOSITION).is_none(),
            "{uri}"
        );
    }
    let post = call(
        &router,
        "POST",
        "/ui/download/team/d0.tfstate?at=1",
        "ann",
        "",
    )
    .await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[test]
fn download_names_come_from_the_state_and_the_version() {
    use gitstate_core::StateName;
    let name = |text: &str| StateName::parse(text).expect("valid");
    let id = "0123456789abcdef0123456789abcdef01234567";
    assert_eq!(
        super::download::file_name(&name("net/prod.tfstate"), id, Some(7)),
        "prod-serial-7.tfstate"
    );
    assert_eq!(
        super::download::file_name(&name("a/b/c.json"), id, None),
        "c.json-0123456789.tfstate"
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(2505);
    let alphabet: Vec<char> = ('a'..='z')
        .chain('0'..='9')
        .chain(['.', '_', '-'])
        .collect();
    for _ in 0..2000 {
        let segments: Vec<String> = (0..rng.random_range(1..4))
            .map(|_| {
                let mut s: String = (0..rng.random_range(1..12))
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect();
                s.insert(0, 'x');
                s
            })
            .collect();
        let Ok(parsed) = StateName::parse(&segments.join("/")) else {
            continue;
        };
        let serial = rng.random_bool(0.7).then(|| rng.random::<u64>());
        let file = super::download::file_name(&parsed, id, serial);
        assert!(file.ends_with(".tfstate") && !file.contains('/'), "{file}");
        assert!(
            file.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)),
            "{file}: needs no quoting"
        );
        assert!(http::HeaderValue::from_str(&format!("attachment; filename=\"{file}\"")).is_ok());
    }
}

/// `/` leads a browser to the console (before any credentials); any other client, and any
/// other method or address spelt with `/`, keeps its answer: never a redirect, never a state.
#[tokio::test]
async fn the_root_leads_browsers_to_the_console_only() {
    let router = app();
    for user in [None, Some("rita")] {
        for method in ["GET", "HEAD"] {
            let request = as_browser("/").method(method);
            let answer = send(&router, request, user, Body::empty()).await;
            assert_eq!(answer.status, StatusCode::SEE_OTHER, "{method} {user:?}");
            assert_eq!(
                answer
                    .headers
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok()),
                Some("/ui/")
            );
            assert!(answer.headers.contains_key(header::CONTENT_SECURITY_POLICY));
        }
        // Terraform, OpenTofu, curl: no Accept, or JSON, or anything.
        for accept in [None, Some("application/json"), Some("*/*")] {
            let mut request = http::Request::builder().uri("/");
            if let Some(accept) = accept {
                request = request.header(header::ACCEPT, accept);
            }
            let answer = send(&router, request, user, Body::empty()).await;
            let expected = match user {
                None => StatusCode::UNAUTHORIZED,
                Some(_) => StatusCode::BAD_REQUEST,
            };
            assert_eq!(
                answer.status,
                expected,
                "{accept:?} {user:?}: {}",
                text(&answer)
            );
            assert!(answer.headers.get(header::LOCATION).is_none());
        }
    }
    // The seed's address format at `/` is the state, for a browser too.
    write_as(
        &router,
        "seed/s.tfstate",
        "OperationTypeApply",
        &state(3, &BTreeMap::new()),
    )
    .await;
    let seed =
        "/?type=git&repository=https://git.example/org/state.git&ref=main&state=seed/s.tfstate";
    let answer = send(&router, as_browser(seed), Some("rita"), Body::empty()).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", text(&answer));
    assert!(text(&answer).contains("\"serial\":3"));
    let post = send(
        &router,
        as_browser("/").method("POST"),
        Some("ann"),
        Body::empty(),
    )
    .await;
    assert_ne!(post.status, StatusCode::SEE_OTHER);
}
