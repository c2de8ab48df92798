//! `GET /states`, the state index and the web console, against a real `git http-backend`, with
//! the console driven in a real headless Chromium through chromedriver (WebDriver over loopback).
//!
//! Chromium and chromedriver must be installed (`apt-get install -y chromium chromium-driver`):
//! without them the browser test fails, it never skips.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use gitstate_tests::{
    Client, GitServer, TEST_PASSWORD, TEST_USER, TestBackend, access_file, commit_file,
    init_tracing, stored_file,
};

const READER: (&str, &str) = ("reader", "reader-Pa55word-for-the-console");
const OUTSIDER: (&str, &str) = ("outsider", "outsider-Pa55word-for-the-console");
const PROD: &str = "net/prod.tfstate";

/// A state whose every attribute and output value is a marker no page may show.
fn state(
    serial: u64,
    resources: &[(&str, &str, Option<Value>, &str)],
    outputs: &[(&str, &str)],
) -> String {
    let resources: Vec<Value> = resources
        .iter()
        .map(|(kind, name, key, value)| {
            let mut instance = json!({"schema_version": 0, "attributes": {"id": format!("SECRET-ATTR-{value}"), "password": format!("SECRET-ATTR-pw-{value}")}});
            if let Some(key) = key {
                instance["index_key"] = key.clone();
            }
            json!({"mode": "managed", "type": kind, "name": name, "provider": "provider[\"registry.terraform.io/hashicorp/null\"]", "instances": [instance]})
        })
        .collect();
    let outputs: serde_json::Map<String, Value> = outputs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), json!({"value": format!("SECRET-OUTPUT-{value}"), "type": "string", "sensitive": true})))
        .collect();
    json!({"version": 4, "terraform_version": "1.11.4", "serial": serial, "lineage": "lin-prod", "outputs": outputs, "resources": resources}).to_string()
}

/// The three versions of `net/prod.tfstate`: created; one resource changed, one added, an
/// output changed; one removed, an output removed.
fn prod_versions() -> [String; 3] {
    [
        state(
            1,
            &[
                ("null_resource", "a", None, "1"),
                ("random_id", "b", Some(json!(0)), "1"),
            ],
            &[("endpoint", "1"), ("token", "1")],
        ),
        state(
            2,
            &[
                ("null_resource", "a", None, "2"),
                ("random_id", "b", Some(json!(0)), "1"),
                ("random_id", "b", Some(json!("blue")), "1"),
            ],
            &[("endpoint", "2"), ("token", "1")],
        ),
        state(
            3,
            &[
                ("null_resource", "a", None, "2"),
                ("random_id", "b", Some(json!("blue")), "1"),
            ],
            &[("endpoint", "2")],
        ),
    ]
}

struct Fixture {
    server: GitServer,
    backend: TestBackend,
    admin: Client,
}

/// A repository with states under net/ and app/, one written by another tool behind the
/// backend's back, and a lock on net/prod.tfstate held by the admin.
async fn fixture() -> Fixture {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let access = access_file(&[
        (TEST_USER, TEST_PASSWORD, &["admin:*"]),
        (READER.0, READER.1, &["read:net/"]),
        (OUTSIDER.0, OUTSIDER.1, &["write:app/"]),
    ]);
    let backend = TestBackend::start(&url, &[("GITSTATE_ACCESS", &access)]).await;
    let admin = Client::new(&backend.url);
    for body in prod_versions() {
        admin.write(PROD, &body).await.expect(200);
    }
    for (name, serial) in [("net/dev.tfstate", 4), ("app/web.tfstate", 9)] {
        let body = state(serial, &[("null_resource", "x", None, "1")], &[]);
        assert_eq!(
            admin
                .send("PUT", &format!("/states/{name}"), Some(&body))
                .await
                .status,
            200
        );
    }
    commit_file(
        &server,
        "state",
        "net/foreign.tfstate",
        state(7, &[("null_resource", "f", None, "1")], &[]).as_bytes(),
    );
    admin.lock(PROD, "lock-1").await.expect(200);
    Fixture {
        server,
        backend,
        admin,
    }
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|s| s["state"].as_str().expect("a name"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_list_is_filtered_by_grant_and_read_from_the_index() {
    let f = fixture().await;
    // A lock on a state not written yet is listed too.
    f.admin
        .lock("net/new.tfstate", "lock-new")
        .await
        .expect(200);

    let index: Value =
        serde_json::from_slice(&stored_file(&f.server, "state", ".gitstate/index.json"))
            .expect("the index is JSON");
    let indexed: Vec<&String> = index["states"]
        .as_object()
        .expect("states")
        .keys()
        .collect();
    assert_eq!(
        indexed,
        ["app/web.tfstate", "net/dev.tfstate", PROD],
        "written in the same commits"
    );
    assert_eq!(index["states"][PROD]["serial"], 3);

    let list = |user: (&str, &str)| {
        let client = Client::with_credentials(&f.backend.url, Some(user));
        async move {
            let answer = client.send("GET", "/states", None).await;
            assert_eq!(answer.status, 200, "{}", answer.body);
            serde_json::from_str::<Value>(&answer.body).expect("JSON")
        }
    };
    let all = list((TEST_USER, TEST_PASSWORD)).await;
    assert_eq!(
        names(&all),
        [
            "app/web.tfstate",
            "net/dev.tfstate",
            "net/foreign.tfstate",
            "net/new.tfstate",
            PROD
        ]
    );
    let by_name = |name: &str| {
        all.as_array()
            .expect("list")
            .iter()
            .find(|s| s["state"] == name)
            .cloned()
            .expect("listed")
    };
    let prod = by_name(PROD);
    assert_eq!(
        (prod["serial"].as_u64(), prod["lineage"].as_str()),
        (Some(3), Some("lin-prod"))
    );
    assert_eq!(prod["author"], TEST_USER);
    assert_eq!(prod["lock"]["id"], "lock-1");
    assert_eq!(prod["lock"]["user"], TEST_USER);
    assert!(prod["updated"].as_i64().is_some());
    // Written by another tool: not in the index, worked out from its content and history.
    let foreign = by_name("net/foreign.tfstate");
    assert_eq!(foreign["serial"].as_u64(), Some(7));
    assert!(
        foreign["author"]
            .as_str()
            .is_some_and(|a| !a.is_empty() && a != TEST_USER)
    );
    let new = by_name("net/new.tfstate");
    assert!(new["serial"].is_null() && new["updated"].is_null());
    assert_eq!(new["lock"]["id"], "lock-new");

    let reader = list(READER).await;
    assert_eq!(
        names(&reader),
        [
            "net/dev.tfstate",
            "net/foreign.tfstate",
            "net/new.tfstate",
            PROD
        ]
    );
    let outsider = list(OUTSIDER).await;
    assert_eq!(names(&outsider), ["app/web.tfstate"]);
    assert!(
        !outsider.to_string().contains("lock-1"),
        "no lock of a state outside the grants"
    );

    // A delete removes the entry in the same commit.
    f.admin
        .delete_state("net/dev.tfstate", None)
        .await
        .expect(200);
    let index: Value =
        serde_json::from_slice(&stored_file(&f.server, "state", ".gitstate/index.json"))
            .expect("JSON");
    assert!(index["states"].get("net/dev.tfstate").is_none());
    assert!(!names(&list(READER).await).contains(&"net/dev.tfstate"));
    // The index is not a state: not addressable, not listed.
    f.admin.get_state(".gitstate/index.json").await.expect(400);
}

/// The console's forms refuse cross-site posts, posts without the token or confirmation, and
/// anyone without the admin grant, whatever they send; nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_actions_are_refused_unless_same_origin_admin_token_and_confirmed() {
    let f = fixture().await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let base = f.backend.url.clone();
    let host = base.trim_start_matches("http://").to_owned();
    let page = |user: (&str, &str)| {
        let (http, base) = (http.clone(), base.clone());
        let (u, p) = (user.0.to_owned(), user.1.to_owned());
        async move {
            let r = http
                .get(format!("{base}/ui/states/{PROD}"))
                .basic_auth(u, Some(p))
                .send()
                .await
                .expect("answers");
            assert_eq!(r.status(), 200);
            let csp = r.headers()["content-security-policy"]
                .to_str()
                .expect("ascii")
                .to_owned();
            assert!(
                csp.contains("default-src 'none'") && csp.contains("form-action 'self'"),
                "{csp}"
            );
            r.text().await.expect("text")
        }
    };
    let admin_page = page((TEST_USER, TEST_PASSWORD)).await;
    let token = admin_page
        .split("name=\"token\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the admin page has a form token")
        .to_owned();
    let reader_page = page(READER).await;
    assert!(
        !reader_page.contains("<form method=\"post\"") && !reader_page.contains("name=\"token\"")
    );
    assert!(!reader_page.contains("Force-unlock"));

    let post =
        |user: (&str, &str), path: &str, headers: Vec<(&'static str, String)>, form: String| {
            let mut request = http
                .post(format!("{base}{path}"))
                .basic_auth(user.0, Some(user.1))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(form);
            for (k, v) in headers {
                request = request.header(k, v);
            }
            async move {
                let r = request.send().await.expect("answers");
                (r.status().as_u16(), r.text().await.unwrap_or_default())
            }
        };
    let same = || {
        vec![
            ("origin", format!("http://{host}")),
            ("sec-fetch-site", "same-origin".to_owned()),
        ]
    };
    let unlock = format!("/ui/unlock/{PROD}");
    let form = |token: &str| format!("token={token}&lock=lock-1&confirm=yes");
    let admin = (TEST_USER, TEST_PASSWORD);
    let refusals = [
        (
            admin,
            vec![("origin", "http://evil.example".to_owned())],
            form(&token),
            403,
            "cross-site",
        ),
        (
            admin,
            vec![
                ("origin", format!("http://{host}")),
                ("sec-fetch-site", "cross-site".to_owned()),
            ],
            form(&token),
            403,
            "cross-site",
        ),
        (admin, vec![], form(&token), 403, "cross-site"),
        (admin, same(), form("forged"), 403, "form token"),
        // Another scheme is another origin: this listener is plain http.
        (
            admin,
            vec![("origin", format!("https://{host}"))],
            form(&token),
            403,
            "cross-site",
        ),
        // The token a page would carry if it were keyed by the password.
        (
            admin,
            same(),
            form(&password_keyed(admin)),
            403,
            "form token",
        ),
        (
            admin,
            same(),
            "lock=lock-1&confirm=yes".to_owned(),
            403,
            "form token",
        ),
        (
            admin,
            same(),
            format!("token={token}&lock=lock-1"),
            400,
            "confirm",
        ),
        // The reader's own token, same origin, confirmed: the grant is missing.
        (
            READER,
            same(),
            format!("token={}&lock=lock-1&confirm=yes", "x"),
            403,
            "form token",
        ),
    ];
    for (user, headers, body, status, why) in refusals {
        let (got, text) = post(user, &unlock, headers.clone(), body.clone()).await;
        assert_eq!(got, status, "{headers:?} {body}: {text}");
        assert!(text.contains(why), "{text}");
    }
    // A reader who computes their own token is still refused by the service.
    let reader_token = {
        // The same derivation a page would carry: only the admin page shows it, so a reader posts
        // with a token taken from an admin page of their own making; the grant check refuses.
        token_for(READER)
    };
    let (got, text) = post(
        READER,
        &unlock,
        same(),
        format!("token={reader_token}&lock=lock-1&confirm=yes"),
    )
    .await;
    assert_eq!(got, 403, "{text}");
    assert!(text.contains("needs the"), "{text}");
    let (got, text) = post(
        READER,
        &format!("/ui/restore/{PROD}"),
        same(),
        format!("token={reader_token}&version=1&confirm=yes"),
    )
    .await;
    assert_eq!(got, 403, "{text}");
    let held = f.admin.send("GET", &format!("/locks/{PROD}"), None).await;
    assert_eq!(held.status, 200, "the lock is still held");
    let list: Value =
        serde_json::from_str(&f.admin.send("GET", "/states", None).await.body).expect("JSON");
    assert_eq!(list[3]["serial"], 3, "nothing restored: {list}");

    // The same form, same origin, admin, token, confirmed: released.
    let (got, _) = post(admin, &unlock, same(), form(&token)).await;
    assert_eq!(got, 303);
    f.admin.get_lock(PROD).await.expect(409);
}

/// The form token the console derives for `user` (as the server does: HMAC of the user name
/// keyed by the user's stored argon2 hash, which the access file given to the backend holds).
fn token_for(user: (&str, &str)) -> String {
    use hmac::{Hmac, Mac};
    let key = gitstate_tests::hash_of(user.1);
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key.as_bytes()).expect("any key");
    mac.update(b"gitstate console form\0");
    mac.update(user.0.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

/// The form token keyed by the password, as it once was: a leaked page must not check a guess.
fn password_keyed(user: (&str, &str)) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(user.1.as_bytes()).expect("any key");
    mac.update(b"gitstate console form\0");
    mac.update(user.0.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

// ---------------------------------------------------------------------------------------------
// The browser.

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// chromedriver on a loopback port, killed on drop.
struct Driver {
    url: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
}

/// One browser session (its own profile directory).
struct Browser<'a> {
    driver: &'a Driver,
    session: String,
    /// Where the browser saves downloads, without asking.
    downloads: std::path::PathBuf,
    _profile: tempfile::TempDir,
}

impl Driver {
    async fn start() -> Self {
        for tool in ["chromium", "chromedriver"] {
            let found = std::process::Command::new(tool).arg("--version").output();
            assert!(
                found.is_ok_and(|o| o.status.success()),
                "{tool} is missing: the console test needs a real browser. Install it with \
                 `apt-get install -y chromium chromium-driver` (as root)"
            );
        }
        let port = gitstate_tests::free_port();
        let child = tokio::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let driver = Self {
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            _child: child,
        };
        for _ in 0..200 {
            if let Ok(r) = driver
                .http
                .get(format!("{}/status", driver.url))
                .send()
                .await
                && r.status().is_success()
            {
                return driver;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("chromedriver did not start");
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        match self.try_call(method, path, body).await {
            Ok(value) => value,
            Err(error) => panic!("{error}"),
        }
    }

    async fn try_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let mut request = self.http.request(method, format!("{}{path}", self.url));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.expect("chromedriver answers");
        let status = response.status();
        let text = response.text().await.expect("chromedriver's answer");
        let value: Value = serde_json::from_str(&text).expect("JSON from chromedriver");
        if status.is_success() {
            Ok(value["value"].clone())
        } else {
            Err(format!("WebDriver {path}: {value}"))
        }
    }

    async fn browser(&self, width: u32, height: u32) -> Browser<'_> {
        let profile = tempfile::tempdir().expect("tempdir");
        let args = [
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--no-first-run".to_owned(),
            "--hide-scrollbars".to_owned(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let downloads = profile.path().join("downloads");
        std::fs::create_dir_all(&downloads).expect("downloads/");
        let prefs = json!({
            "download.default_directory": downloads.display().to_string(),
            "download.prompt_for_download": false,
        });
        let mut options = json!({"binary": "/usr/bin/chromium", "args": args, "prefs": prefs});
        if width < 500 {
            // A window cannot be narrower than 500 px: emulate a phone's screen instead.
            options["mobileEmulation"] =
                json!({"deviceMetrics": {"width": width, "height": height, "pixelRatio": 1.0}});
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": options
        }}});
        let session = self
            .call(reqwest::Method::POST, "/session", Some(caps))
            .await;
        Browser {
            driver: self,
            session: session["sessionId"].as_str().expect("a session").to_owned(),
            downloads,
            _profile: profile,
        }
    }
}

impl Browser<'_> {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        self.driver
            .call(method, &format!("/session/{}{path}", self.session), body)
            .await
    }

    async fn go(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// The URL once it ends with `suffix` (navigation after a click may still be under way).
    async fn wait_url(&self, suffix: &str) -> String {
        let mut url = String::new();
        for _ in 0..100 {
            url = self.url().await;
            if url.ends_with(suffix) {
                return url;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "still at {url}, not at …{suffix}: {}",
            self.text("body").await
        );
    }

    async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    async fn find_all(&self, css: &str) -> Vec<String> {
        let found = self
            .call(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
            .collect()
    }

    async fn find(&self, css: &str) -> String {
        let all = self.find_all(css).await;
        assert!(
            !all.is_empty(),
            "no element {css} on {}: {}",
            self.url().await,
            self.text("body").await
        );
        all[0].clone()
    }

    async fn text(&self, css: &str) -> String {
        self.texts(css).await.into_iter().next().unwrap_or_default()
    }

    /// The texts of every element matching `css`; read again if the page was replaced meanwhile
    /// (a navigation a click started).
    async fn texts(&self, css: &str) -> Vec<String> {
        'again: for _ in 0..50 {
            let mut out = Vec::new();
            for e in self.find_all(css).await {
                let path = format!("/session/{}/element/{e}/text", self.session);
                match self
                    .driver
                    .try_call(reqwest::Method::GET, &path, None)
                    .await
                {
                    Ok(text) => out.push(text.as_str().unwrap_or_default().to_owned()),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue 'again;
                    }
                }
            }
            return out;
        }
        panic!("the elements {css} kept going stale");
    }

    async fn click(&self, css: &str) {
        let e = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{e}/click"),
            Some(json!({})),
        )
        .await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{e}/clear"),
            Some(json!({})),
        )
        .await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{e}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    async fn source(&self) -> String {
        self.call(reqwest::Method::GET, "/source", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    async fn screenshot(&self, file: &str) {
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64"))
            .expect("a PNG");
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
        std::fs::create_dir_all(&docs).expect("docs/");
        std::fs::write(docs.join(file), bytes).expect("screenshot written");
    }

    /// The name and content of the one file downloaded, once it is complete.
    async fn downloaded(&self) -> (String, String) {
        for _ in 0..200 {
            // Chromium writes a hidden temporary file, then `<name>.crdownload`, and renames
            // that to `<name>` once the file is whole.
            let files: Vec<_> = std::fs::read_dir(&self.downloads)
                .expect("downloads/")
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| !name.starts_with('.'))
                .collect();
            if let [name] = files.as_slice()
                && !name.ends_with(".crdownload")
            {
                let text = std::fs::read_to_string(self.downloads.join(name)).expect("file");
                return (name.clone(), text);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("nothing was downloaded to {}", self.downloads.display());
    }

    async fn close(self) {
        self.call(reqwest::Method::DELETE, "", None).await;
    }
}

/// The base URL with credentials, as a user types it (the browser keeps them for the origin).
fn with_credentials(base: &str, user: (&str, &str)) -> String {
    base.replacen("http://", &format!("http://{}:{}@", user.0, user.1), 1)
}

fn assert_no_values(html: &str) {
    assert!(!html.contains("SECRET-"), "a page shows a value: {html}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_real_browser() {
    let f = fixture().await;
    let driver = Driver::start().await;
    let base = f.backend.url.clone();

    // --- As admin: the list, the filter, a state, a version's changes.
    let admin = driver.browser(1200, 900).await;
    admin
        .go(&format!(
            "{}/ui/",
            with_credentials(&base, (TEST_USER, TEST_PASSWORD))
        ))
        .await;
    assert_eq!(admin.text("h1").await, "States");
    assert_eq!(
        admin.texts("table.states tbody th").await,
        [
            "app/web.tfstate",
            "net/dev.tfstate",
            "net/foreign.tfstate",
            PROD
        ]
    );
    let prod_row = admin.text("table.states tbody tr:nth-child(4)").await;
    assert!(
        prod_row.contains("Locked") && prod_row.contains("lock-1") && prod_row.contains(TEST_USER),
        "{prod_row}"
    );
    assert!(
        admin
            .text("table.states tbody tr:nth-child(3)")
            .await
            .contains('7'),
        "foreign serial"
    );
    // The stylesheet came from the binary and applied (CSP allows 'self' only).
    let header_colour = admin
        .call(
            reqwest::Method::GET,
            &format!(
                "/element/{}/css/background-color",
                admin.find("header.top").await
            ),
            None,
        )
        .await;
    assert_eq!(header_colour, "rgba(36, 41, 47, 1)", "style.css applied");
    assert_no_values(&admin.source().await);
    admin.screenshot("console-list.png").await;

    admin.type_into("#q", "prod").await;
    admin.click("form.filter button").await;
    admin.wait_url("/ui/?q=prod").await;
    assert_eq!(admin.texts("table.states tbody th").await, [PROD]);
    assert!(admin.text("#count").await.starts_with("1 of 4 states"));

    admin.click("table.states tbody th a").await;
    admin.wait_url(&format!("/ui/states/{PROD}")).await;
    assert_eq!(admin.text("h1").await, PROD);
    let versions = admin.texts("ol.versions > li h3").await;
    assert_eq!(versions, ["Serial 3", "Serial 2", "Serial 1"]);
    let newest = admin.text("ol.versions > li:nth-child(1)").await;
    assert!(
        newest.contains("Removed (1)") && newest.contains("random_id.b[0]"),
        "{newest}"
    );
    assert!(
        newest.contains("Outputs changed (1)") && newest.contains("token"),
        "{newest}"
    );
    let middle = admin.text("ol.versions > li:nth-child(2)").await;
    assert!(
        middle.contains("Added (1)") && middle.contains("random_id.b[\"blue\"]"),
        "{middle}"
    );
    assert!(
        middle.contains("Changed (1)") && middle.contains("null_resource.a"),
        "{middle}"
    );
    assert!(
        middle.contains("Outputs changed (1)") && middle.contains("endpoint"),
        "{middle}"
    );
    let oldest = admin.text("ol.versions > li:nth-child(3)").await;
    assert!(oldest.contains("Added (2)"), "{oldest}");
    assert_eq!(
        admin.texts("table.resources tbody td code").await,
        ["null_resource.a", "random_id.b[\"blue\"]"]
    );
    assert_no_values(&admin.source().await);
    // Tall enough to show the versions and their changes.
    admin
        .call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": 1200, "height": 1750})),
        )
        .await;
    admin.screenshot("console-state.png").await;

    // --- A cross-site form (another origin the browser visits) posting to the console with
    // the admin's ambient credentials and even the right token: 403, nothing changes.
    let token = admin
        .call(
            reqwest::Method::GET,
            &format!(
                "/element/{}/property/value",
                admin.find("input[name=token]").await
            ),
            None,
        )
        .await
        .as_str()
        .expect("token")
        .to_owned();
    let evil_page = format!(
        r#"<!doctype html><title>evil</title><form method="post" action="{base}/ui/unlock/{PROD}">
        <input type="hidden" name="token" value="{token}"><input type="hidden" name="lock" value="lock-1">
        <input type="hidden" name="confirm" value="yes"><button id="go">win a prize</button></form>"#
    );
    let evil = axum::Router::new().fallback(move || {
        let page = evil_page.clone();
        async move { axum::response::Html(page) }
    });
    let (evil_address, _evil) = gitstate_tests::serve_on_loopback(evil).await;
    let evil_port = evil_address.port();
    // `localhost` is another site than `127.0.0.1` for the browser.
    admin.go(&format!("http://localhost:{evil_port}/")).await;
    admin.click("#go").await;
    // The post's answer replaces the page: wait for it before reading it.
    admin.wait_url(&format!("/ui/unlock/{PROD}")).await;
    let refused = admin.text("body").await;
    assert!(refused.contains("cross-site request refused"), "{refused}");
    assert_eq!(
        f.admin
            .send("GET", &format!("/locks/{PROD}"), None)
            .await
            .status,
        200,
        "still locked"
    );

    // --- Force-unlock through the page's own form, with its confirmation.
    admin.go(&format!("{base}/ui/states/{PROD}")).await;
    admin.click("#force-unlock").await;
    // The confirmation box is required: the browser does not submit without it.
    assert!(admin.url().await.ends_with(&format!("/ui/states/{PROD}")));
    f.admin.get_lock(PROD).await.expect(200);
    admin.click("#confirm-unlock").await;
    admin.click("#force-unlock").await;
    admin.wait_url("?done=unlocked").await;
    assert_eq!(admin.text(".notice").await, "The lock was released.");
    assert_eq!(admin.text("#lock-heading + p").await, "Not locked.");
    f.admin.get_lock(PROD).await.expect(409);

    // --- Restore serial 1 through its form.
    admin
        .click("ol.versions > li:nth-child(3) details summary")
        .await;
    admin
        .click("ol.versions > li:nth-child(3) details input[name=confirm]")
        .await;
    admin
        .click("ol.versions > li:nth-child(3) details button")
        .await;
    admin.wait_url("?done=restored").await;
    assert_eq!(admin.texts("ol.versions > li h3").await[0], "Serial 4");
    let current: Value = serde_json::from_str(
        &f.admin
            .send("GET", &format!("/states/{PROD}"), None)
            .await
            .body,
    )
    .expect("JSON");
    let first: Value = serde_json::from_str(&prod_versions()[0]).expect("JSON");
    assert_eq!(
        (current["serial"].as_u64(), &current["resources"]),
        (Some(4), &first["resources"])
    );
    admin.close().await;

    // --- As a reader, at phone width: the states of the grant, no controls anywhere.
    let reader = driver.browser(390, 844).await;
    reader
        .go(&format!("{}/ui/", with_credentials(&base, READER)))
        .await;
    assert_eq!(
        reader.texts("table.states tbody th").await,
        ["net/dev.tfstate", "net/foreign.tfstate", PROD]
    );
    // Phone width: the table turns into cards, nothing wider than the screen.
    let width = reader
        .call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": "return document.documentElement.scrollWidth", "args": []})),
        )
        .await;
    assert!(
        width.as_u64().is_some_and(|w| w <= 390),
        "page is {width} px wide"
    );
    reader.screenshot("console-phone.png").await;
    reader.go(&format!("{base}/ui/states/{PROD}")).await;
    assert_eq!(reader.text("h1").await, PROD);
    assert!(
        reader.find_all("form[method=post]").await.is_empty(),
        "a reader sees no controls"
    );
    assert!(reader.find_all("details").await.is_empty());
    assert_no_values(&reader.source().await);
    reader.close().await;
}

/// Write `states` to `name`, each under a lock naming the operation beside it, as Terraform does.
async fn write_with_operations(client: &Client, name: &str, states: &[(&str, String)]) {
    for (i, (operation, body)) in states.iter().enumerate() {
        let info = json!({"ID": format!("op-{i}"), "Operation": operation, "Who": "ci@runner"})
            .to_string();
        let lock = format!("/locks/{name}");
        client.send("POST", &lock, Some(&info)).await.expect(200);
        client
            .write_locked(name, &format!("op-{i}"), body)
            .await
            .expect(200);
        client.send("DELETE", &lock, Some(&info)).await.expect(200);
    }
}

/// Seconds an age as the console words it says (`3h5m`); the test fails on anything else.
fn age_seconds(text: &str) -> u64 {
    let (mut total, mut number) = (0, String::new());
    for c in text.chars() {
        match c {
            '0'..='9' => number.push(c),
            'd' | 'h' | 'm' | 's' => {
                let unit = match c {
                    'd' => 86_400,
                    'h' => 3600,
                    'm' => 60,
                    _ => 1,
                };
                total += number.parse::<u64>().expect("a number before a unit") * unit;
                number.clear();
            }
            _ => panic!("{text:?} is not an age"),
        }
    }
    assert!(number.is_empty() && !text.is_empty(), "{text:?}");
    total
}

/// What issue 25 added to the console, as a browser shows it: operations in words, one
/// wording for lock ages, the backend block selected by a click, the compact view's counts, a
/// restore naming its source, and styled 403/404 pages with a way back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_words_views_and_error_pages_in_a_real_browser() {
    let f = fixture().await;
    let ops = "net/ops.tfstate";
    let one = |serial| state(serial, &[("null_resource", "x", None, "1")], &[]);
    write_with_operations(
        &f.admin,
        ops,
        &[
            ("migration destination state", one(1)),
            ("OperationTypeApply", one(2)),
            ("state-push", one(3)),
        ],
    )
    .await;
    let driver = Driver::start().await;
    let base = f.backend.url.clone();
    let admin = driver.browser(1200, 900).await;
    admin
        .go(&format!(
            "{}/ui/",
            with_credentials(&base, (TEST_USER, TEST_PASSWORD))
        ))
        .await;
    let rows = admin.texts("table.states tbody tr").await;
    let ops_row = rows.iter().find(|r| r.starts_with(ops)).expect("the row");
    assert!(ops_row.contains("state push"), "{ops_row}");
    let prod_row = rows.iter().find(|r| r.starts_with(PROD)).expect("the row");
    assert!(
        prod_row.contains("held for") && prod_row.contains("apply"),
        "{prod_row}"
    );
    let list_age = age_seconds(&admin.text("table.states .age").await);
    assert!(!admin.source().await.contains(">OperationType"));

    // --- One state's versions: the operations in words, as cards and as rows.
    admin.go(&format!("{base}/ui/states/{ops}")).await;
    assert_eq!(
        admin.texts("ol.versions .operation").await,
        ["state push", "apply", "migration"]
    );
    admin.click("#view-compact").await;
    admin.wait_url("view=compact").await;
    assert_eq!(
        admin
            .texts("table.compact tbody td[data-label=Operation]")
            .await,
        ["state push", "apply", "migration"]
    );

    // --- The locked state: the same age wording as the list, the backend block.
    admin.go(&format!("{base}/ui/states/{PROD}")).await;
    assert_eq!(admin.text("dl.facts dd[title]").await, "apply");
    let page_age = age_seconds(&admin.text("dl.facts .age").await);
    assert!(
        page_age >= list_age && page_age < list_age + 60,
        "{list_age} then {page_age}"
    );
    let block = admin.text("#backend-block").await;
    let expected = format!(
        "terraform {{\n  backend \"http\" {{\n    address        = \"{base}/states/{PROD}\"\n    lock_address   = \"{base}/locks/{PROD}\"\n    unlock_address = \"{base}/locks/{PROD}\"\n    lock_method    = \"POST\"\n    unlock_method  = \"DELETE\"\n  }}\n}}"
    );
    assert_eq!(block, expected);
    admin.click("#backend-block").await;
    let selected = admin
        .call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": "return window.getSelection().toString()", "args": []})),
        )
        .await;
    assert_eq!(
        selected.as_str().map(str::trim),
        Some(expected.as_str()),
        "one click selects it all"
    );

    // --- Compact: one row a version with what it added, changed and removed.
    admin.click("#view-compact").await;
    admin.wait_url("view=compact").await;
    assert_eq!(admin.texts("table.compact tbody th").await, ["3", "2", "1"]);
    for (class, counts) in [
        ("added-count", ["0", "1", "2"]),
        ("changed-count", ["0", "1", "0"]),
        ("removed-count", ["1", "0", "0"]),
    ] {
        assert_eq!(
            admin.texts(&format!("table.compact td.{class}")).await,
            counts,
            "{class}"
        );
    }
    assert_no_values(&admin.source().await);
    admin
        .call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": 1200, "height": 1500})),
        )
        .await;
    admin.screenshot("console-compact.png").await;

    // --- Each version downloads as a file: the history's read of it, named for people.
    let newest = f
        .admin
        .send("GET", &format!("/history/{PROD}"), None)
        .await
        .expect(200)
        .json()["versions"][0]["version"]
        .as_str()
        .expect("id")
        .to_owned();
    admin
        .click("table.compact tbody tr:first-child a.download")
        .await;
    let (file, content) = admin.downloaded().await;
    assert_eq!(file, "prod-serial-3.tfstate");
    let via_history = f
        .admin
        .send("GET", &format!("/history/{PROD}?at={newest}"), None)
        .await
        .expect(200);
    assert_eq!(content, via_history.body);
    assert_eq!(
        serde_json::from_str::<Value>(&content).expect("JSON")["serial"],
        3
    );
    // Read like any read: a reader outside the grant is refused.
    let outsider = Client::with_credentials(&base, Some(OUTSIDER));
    outsider
        .send("GET", &format!("/ui/download/{PROD}?at={newest}"), None)
        .await
        .expect(403);

    // --- A restore names the version it wrote again, in both views.
    f.admin.unlock(PROD, "lock-1").await.expect(200);
    let restored = f
        .admin
        .send("POST", &format!("/history/{PROD}?restore=1"), None)
        .await
        .expect(200)
        .json();
    let from = restored["from"].as_str().expect("from").to_owned();
    admin
        .go(&format!("{base}/ui/states/{PROD}?view=compact"))
        .await;
    assert_eq!(
        admin
            .text("table.compact tbody tr:first-child td[data-label=Operation]")
            .await,
        "restore of serial 1"
    );
    admin.click("#view-cards").await;
    admin
        .wait_url(&format!("/ui/states/{PROD}?page=0&per_page=20"))
        .await;
    let card = admin.text("ol.versions > li:first-child .restored").await;
    assert_eq!(
        card,
        format!("Restored from serial 1, version {}.", &from[..10])
    );
    admin
        .click("ol.versions > li:first-child .restored a")
        .await;
    admin.wait_url(&format!("#v-{from}")).await;

    // --- The root leads to the console.
    admin.go(&format!("{base}/")).await;
    admin.wait_url("/ui/").await;
    assert_eq!(admin.text("h1").await, "States");

    // --- A missing state and a missing page: styled, with a way back.
    admin
        .call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": 1000, "height": 600})),
        )
        .await;
    for path in ["/ui/nowhere", "/ui/states/net/missing.tfstate"] {
        admin.go(&format!("{base}{path}")).await;
        assert_eq!(admin.text("h1").await, "Not found", "{path}");
        assert_eq!(admin.text(".error-page .status").await, "Error 404");
        let colour = admin
            .call(
                reqwest::Method::GET,
                &format!(
                    "/element/{}/css/background-color",
                    admin.find("header.top").await
                ),
                None,
            )
            .await;
        assert_eq!(colour, "rgba(36, 41, 47, 1)", "style.css applied on {path}");
    }
    admin.screenshot("console-not-found.png").await;
    admin.click("#back").await;
    admin.wait_url("/ui/").await;
    assert_eq!(admin.text("h1").await, "States");
    admin.close().await;

    // --- A state outside the reader's grant: 403, styled, the reason, a way back.
    let reader = driver.browser(1200, 900).await;
    reader
        .go(&format!(
            "{}/ui/states/app/web.tfstate",
            with_credentials(&base, READER)
        ))
        .await;
    assert_eq!(reader.text("h1").await, "Not allowed");
    assert_eq!(reader.text(".error-page .status").await, "Error 403");
    assert!(
        reader.text("#reason").await.contains("reader"),
        "names the user"
    );
    reader.click("#back").await;
    reader.wait_url("/ui/").await;
    assert_eq!(reader.texts("table.states tbody th").await.len(), 4);
    reader.close().await;
}

/// A list by a fresh backend (cold cache): the backend, the git requests it made, the list.
async fn cold_list(
    server: &GitServer,
    url: &str,
    settings: &[(&str, &str)],
) -> (TestBackend, Vec<String>, Value) {
    let backend = TestBackend::start(url, settings).await;
    server.take_requests();
    let answer = Client::new(&backend.url).send("GET", "/states", None).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let list: Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(list.as_array().map(Vec::len), Some(20));
    (backend, server.take_labels(), list)
}

/// Git requests of a list in a process with a cold cache, exactly: with the access file in the
/// repository (the default) or given by the deployment, with and without locks held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_list_takes_at_most_three_git_requests() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let access = access_file(&[(TEST_USER, TEST_PASSWORD, &["admin:*"])]);
    commit_file(&server, "state", ".gitstate/access.toml", access.as_bytes());
    // Any GITSTATE_ACCESS* setting keeps the harness from giving the policy as text.
    let in_repository = [("GITSTATE_ACCESS_REFRESH_SECS", "10")];
    let from_deployment = [("GITSTATE_ACCESS", access.as_str())];
    let writer = TestBackend::start(&url, &in_repository).await;
    let admin = Client::new(&writer.url);
    for i in 0..20 {
        let body = state(i + 1, &[("null_resource", "x", None, "1")], &[]);
        let answer = admin
            .send(
                "PUT",
                &format!("/states/team-{}/s{i}.tfstate", i % 3),
                Some(&body),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    // No locks: the access file's advertisement and fetch serve the list too.
    let (_, labels, _) = cold_list(&server, &url, &in_repository).await;
    assert_eq!(labels, ["GET refs/upload-pack", "POST upload-pack"]);
    let (_, labels, _) = cold_list(&server, &url, &from_deployment).await;
    assert_eq!(labels, ["GET refs/upload-pack", "POST upload-pack"]);

    // Locks held: one more fetch brings every lock commit at once.
    admin.lock("team-0/s0.tfstate", "l-0").await.expect(200);
    admin.lock("team-1/s1.tfstate", "l-1").await.expect(200);
    let (warm, labels, list) = cold_list(&server, &url, &in_repository).await;
    assert_eq!(
        labels,
        [
            "GET refs/upload-pack",
            "POST upload-pack",
            "POST upload-pack"
        ]
    );
    assert_eq!(list[0]["lock"]["id"], "l-0");
    let (_, labels, _) = cold_list(&server, &url, &from_deployment).await;
    assert_eq!(
        labels,
        ["GET refs/upload-pack", "POST upload-pack"],
        "tip and locks in one fetch"
    );

    // Warm, nothing changed: one advertisement (after the second an advertisement is trusted).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    server.take_requests();
    let answer = Client::new(&warm.url).send("GET", "/states", None).await;
    assert_eq!(answer.status, 200);
    assert_eq!(server.take_labels(), ["GET refs/upload-pack"]);
}

/// The console through the Lambda runtime's own request conversion: a Function URL event (the
/// shape of `events/`) for the list page, and the force-unlock form posted as a browser on the
/// Function URL's origin posts it (base64 body, as Function URLs deliver form posts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_through_function_url_events() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let f = fixture().await;
    let cache = tempfile::tempdir().expect("tempdir");
    let access = access_file(&[(TEST_USER, TEST_PASSWORD, &["admin:*"])]);
    let router = gitstate_tests::app(&gitstate_tests::settings_for(
        &f.server.url("state"),
        cache.path(),
        &[("GITSTATE_ACCESS", &access)],
    ))
    .await;
    let template: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../events/force-unlock.json"
        ))
        .expect("event file"),
    )
    .expect("JSON");
    let domain = template["headers"]["host"]
        .as_str()
        .expect("host")
        .to_owned();
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{TEST_USER}:{TEST_PASSWORD}"))
    );
    let event = |method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>| {
        let mut event = template.clone();
        event["rawPath"] = json!(path);
        event["requestContext"]["http"]["path"] = json!(path);
        event["requestContext"]["http"]["method"] = json!(method);
        event["headers"]["authorization"] = json!(basic);
        for (k, v) in headers {
            event["headers"][*k] = json!(v);
        }
        if let Some(body) = body {
            event["body"] = json!(base64::engine::general_purpose::STANDARD.encode(body));
            event["isBase64Encoded"] = json!(true);
        }
        lambda_http::request::from_str(&event.to_string()).expect("lambda_http accepts it")
    };
    let send = |request: lambda_http::Request| {
        let router = router.clone();
        async move {
            let response = router.oneshot(request).await.expect("router answers");
            let status = response.status().as_u16();
            let location = response
                .headers()
                .get("location")
                .map(|l| l.to_str().unwrap_or_default().to_owned());
            let body = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            (
                status,
                location,
                String::from_utf8_lossy(&body).into_owned(),
            )
        }
    };
    let (status, _, page) = send(event("GET", "/ui/", &[], None)).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(PROD) && page.contains("lock-1"), "{page}");
    let (status, _, page) = send(event("GET", &format!("/ui/states/{PROD}"), &[], None)).await;
    assert_eq!(status, 200);
    let token = token_for((TEST_USER, TEST_PASSWORD));
    assert!(
        page.contains(&token),
        "the page carries the same token in every container"
    );
    let form = format!("token={token}&lock=lock-1&confirm=yes");
    let headers = [
        ("origin", format!("https://{domain}")),
        ("sec-fetch-site", "same-origin".to_owned()),
        (
            "content-type",
            "application/x-www-form-urlencoded".to_owned(),
        ),
    ];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let cross: Vec<(&str, &str)> = vec![("origin", "https://evil.example"), headers[2]];
    let (status, _, _) = send(event(
        "POST",
        &format!("/ui/unlock/{PROD}"),
        &cross,
        Some(&form),
    ))
    .await;
    assert_eq!(status, 403);
    let (status, location, body) = send(event(
        "POST",
        &format!("/ui/unlock/{PROD}"),
        &headers,
        Some(&form),
    ))
    .await;
    assert_eq!(status, 303, "{body}");
    assert_eq!(
        location.as_deref(),
        Some(format!("/ui/states/{PROD}?done=unlocked").as_str())
    );
    f.admin.get_lock(PROD).await.expect(409);
}

/// One request as it reached the backend, and its answer.
#[derive(Debug, Clone)]
struct Arrived {
    method: String,
    path: String,
    fetch_site: Option<String>,
    origin: Option<String>,
    authorization: bool,
    status: u16,
    body: String,
}

type Arrivals = std::sync::Arc<std::sync::Mutex<Vec<Arrived>>>;

/// Record every request that reaches the router and its answer (outermost layer: it sees what
/// the guard answers).
async fn record(
    axum::extract::State(seen): axum::extract::State<Arrivals>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let headers = request.headers();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let mut arrived = Arrived {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
        fetch_site: header("sec-fetch-site"),
        origin: header("origin"),
        authorization: headers.contains_key("authorization"),
        status: 0,
        body: String::new(),
    };
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    arrived.status = parts.status.as_u16();
    arrived.body = String::from_utf8_lossy(&bytes).chars().take(300).collect();
    seen.lock().expect("arrivals").push(arrived);
    axum::response::Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// The refs of the bare repository and the trees they point at.
fn repository_snapshot(dir: &std::path::Path) -> String {
    let refs = gitstate_tests::git(
        &["for-each-ref", "--format=%(objectname) %(refname)"],
        Some(dir),
    );
    let mut out = refs.clone();
    for line in refs.lines() {
        let (_, name) = line.split_once(' ').expect("ref line");
        out.push_str(&gitstate_tests::git(
            &["ls-tree", "-r", "--full-tree", name],
            Some(dir),
        ));
    }
    out
}

/// What a page of another site tries against the API, in the page: `fetch` with a typeless
/// `Blob` body (no Content-Type, so no preflight) and the browser's credentials, with no-cors,
/// an XHR, the non-simple methods, an explicit `Authorization` header, credentials in the URL.
/// Each attempt's outcome as the page sees it.
const CROSS_SITE_SCRIPT: &str = r#"
const [base, withCredentials, name, state, lock, auth, done] = arguments;
const out = [];
const attempt = async (label, run) => {
  try { const r = await run(); out.push({label, seen: r.type + ' ' + r.status}); }
  catch (e) { out.push({label, seen: 'error ' + e}); }
};
const blob = (text) => new Blob([text]);
(async () => {
  await attempt('fetch POST state', () => fetch(`${base}/states/${name}`,
    {method: 'POST', body: blob(state), credentials: 'include'}));
  await attempt('fetch POST state no-cors', () => fetch(`${base}/states/${name}`,
    {method: 'POST', body: blob(state), credentials: 'include', mode: 'no-cors'}));
  await attempt('fetch POST lock', () => fetch(`${base}/locks/${name}`,
    {method: 'POST', body: blob(lock), credentials: 'include', mode: 'no-cors'}));
  await attempt('fetch DELETE state', () => fetch(`${base}/states/${name}`,
    {method: 'DELETE', credentials: 'include'}));
  await attempt('fetch DELETE lock', () => fetch(`${base}/locks/${name}`,
    {method: 'DELETE', body: blob(lock), credentials: 'include'}));
  await attempt('fetch LOCK', () => fetch(`${base}/states/${name}`,
    {method: 'LOCK', body: blob(lock), credentials: 'include'}));
  await attempt('fetch POST with Authorization', () => fetch(`${base}/states/${name}`,
    {method: 'POST', body: blob(state), credentials: 'include', headers: {Authorization: auth}}));
  await attempt('fetch POST, credentials in the URL', () => fetch(`${withCredentials}/states/${name}`,
    {method: 'POST', body: blob(state), credentials: 'include', mode: 'no-cors'}));
  await attempt('XHR POST with credentials', () => new Promise((resolve, reject) => {
    const x = new XMLHttpRequest();
    x.open('POST', `${base}/states/${name}`);
    x.withCredentials = true;
    x.onload = () => resolve({type: 'xhr', status: x.status});
    x.onerror = () => reject(new Error('network error'));
    x.send(blob(state));
  }));
  await attempt('XHR POST, user and password given', () => new Promise((resolve, reject) => {
    const [user, password] = atob(auth.slice(6)).split(':');
    const x = new XMLHttpRequest();
    x.open('POST', `${base}/locks/${name}`, true, user, password);
    x.withCredentials = true;
    x.onload = () => resolve({type: 'xhr', status: x.status});
    x.onerror = () => reject(new Error('network error'));
    x.send(blob(lock));
  }));
  done(out);
})();
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_other_sites_cannot_write_through_the_api_in_chromium() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let cache = tempfile::tempdir().expect("tempdir");
    let settings = gitstate_tests::settings_for(&url, cache.path(), &[]);
    let seen = Arrivals::default();
    let app = gitstate_tests::app(&settings)
        .await
        .layer(axum::middleware::from_fn_with_state(seen.clone(), record));
    let backend = TestBackend::serve(app, cache).await;
    let base = backend.url.clone();
    let admin = Client::new(&base);
    let first = state(1, &[("null_resource", "a", None, "1")], &[]);
    admin.write(PROD, &first).await.expect(200);
    let repo = server.repo_dir("state");
    let before = repository_snapshot(&repo);

    // The pages of the attack: one on another site (127.0.0.2), one on the same site but another
    // origin (another port of 127.0.0.1).
    let evil = axum::Router::new().fallback(|| async {
        axum::response::Html("<!doctype html><title>win a prize</title><p>hello")
    });
    let mut origins = Vec::new();
    for host in ["127.0.0.2", "127.0.0.1"] {
        let listener = tokio::net::TcpListener::bind((host, 0))
            .await
            .expect("bind an attacker's origin");
        origins.push(format!(
            "http://{}",
            listener.local_addr().expect("address")
        ));
        let evil = evil.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, evil).await;
        });
    }

    let driver = Driver::start().await;
    let browser = driver.browser(1000, 800).await;
    // The administrator signs in to the console: the browser now holds the credentials.
    browser
        .go(&format!(
            "{}/ui/",
            with_credentials(&base, (TEST_USER, TEST_PASSWORD))
        ))
        .await;
    assert_eq!(browser.text("h1").await, "States");
    seen.lock().expect("arrivals").clear();

    let authorization = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{TEST_USER}:{TEST_PASSWORD}"))
    );
    let bad_state = state(99, &[("null_resource", "evil", None, "9")], &[]);
    let lock = gitstate_tests::lock_info("from-another-site");
    for origin in &origins {
        browser.go(&format!("{origin}/")).await;
        let outcomes = browser
            .call(
                reqwest::Method::POST,
                "/execute/async",
                Some(json!({"script": CROSS_SITE_SCRIPT, "args": [
                    base,
                    with_credentials(&base, (TEST_USER, TEST_PASSWORD)),
                    PROD,
                    bad_state,
                    lock,
                    authorization,
                ]})),
            )
            .await;
        // Chromium's own errors quote the URL with the credentials in it: never print those.
        let shown = outcomes.to_string().replace(TEST_PASSWORD, "<password>");
        eprintln!("from {origin}, as the page saw it: {shown}");
        assert_eq!(outcomes.as_array().map(Vec::len), Some(10), "{shown}");
    }
    browser.close().await;

    let arrived = seen.lock().expect("arrivals").clone();
    for a in &arrived {
        eprintln!(
            "arrived: {} {} sec-fetch-site={:?} origin={:?} authorization={} -> {}",
            a.method, a.path, a.fetch_site, a.origin, a.authorization, a.status
        );
    }
    let writes: Vec<&Arrived> = arrived
        .iter()
        .filter(|a| !matches!(a.method.as_str(), "GET" | "HEAD" | "OPTIONS"))
        .collect();
    // The typeless-Blob POSTs (fetch with and without CORS, the lock, both XHRs) reach the
    // server from both origins; the browser sends the rest only after a preflight that fails.
    assert!(
        writes.len() >= 2 * 5,
        "the simple requests reached the backend: {writes:#?}"
    );
    for origin in &origins {
        assert!(
            writes
                .iter()
                .any(|a| a.origin.as_deref() == Some(origin.as_str())),
            "nothing arrived from {origin}"
        );
    }
    for a in &writes {
        assert_eq!(a.status, 403, "a write from another origin: {a:#?}");
        assert!(
            a.body.contains("cross-site request refused"),
            "the reason: {a:#?}"
        );
        assert!(
            matches!(a.fetch_site.as_deref(), Some("cross-site" | "same-site")),
            "{a:#?}"
        );
    }
    // Nothing changed in the repository: no state written, no lock taken.
    assert_eq!(repository_snapshot(&repo), before);
    admin.get_lock(PROD).await.expect(409);
    assert_eq!(admin.get_state(PROD).await.expect(200).state().serial, 1);

    // Control: the same requests from a client that is not a browser (no Sec-Fetch-Site, no
    // Origin), bodies without a Content-Type, with the administrator's credentials, pass.
    let http = reqwest::Client::new();
    let send = |method: &str, path: &str, body: &str| {
        http.request(
            reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
            format!("{base}{path}"),
        )
        .basic_auth(TEST_USER, Some(TEST_PASSWORD))
        .body(body.to_owned())
        .send()
    };
    let lock_path = format!("/locks/{PROD}");
    let state_path = format!("/states/{PROD}?ID=from-another-site");
    for (method, path, body) in [
        ("POST", lock_path.as_str(), lock.as_str()),
        ("POST", state_path.as_str(), bad_state.as_str()),
        ("DELETE", lock_path.as_str(), lock.as_str()),
    ] {
        let answer = send(method, path, body).await.expect("answered");
        assert_eq!(answer.status(), 200, "{method} {path}");
    }
    assert_eq!(admin.get_state(PROD).await.expect(200).state().serial, 99);
    assert_ne!(repository_snapshot(&repo), before);
}

/// Terraform and OpenTofu pointed at the backend's root (`address = "<base>/"`) fail `init` on
/// a 400, never reading a state or "no state", while a browser at `/` is led to the console.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_is_never_a_state_to_terraform() {
    use crate::terraform::{Cli, terraform_binary, tofu_binary, transcript};
    let f = fixture().await;
    let base = &f.backend.url;
    for (label, cli) in [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ] {
        let work = tempfile::tempdir().expect("tempdir");
        let config = format!(
            "terraform {{\n  backend \"http\" {{\n    address  = \"{base}/\"\n    username = \"{TEST_USER}\"\n    password = \"{TEST_PASSWORD}\"\n    retry_max = 0\n  }}\n}}\n"
        );
        std::fs::write(work.path().join("main.tf"), config).expect("main.tf");
        let init = cli
            .run(work.path(), &["init", "-no-color", "-input=false"])
            .await;
        let text = transcript(&init);
        assert!(!init.status.success(), "{label} must fail at /:\n{text}");
        assert!(
            text.contains("400"),
            "{label}: the status is shown:\n{text}"
        );
    }
    let answer = f.admin.send("GET", "/", None).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.headers.get("location").is_none());
}

/// What terraform and OpenTofu record, run for real: every command that writes a state under a
/// lock (apply, taint, untaint, state mv, state rm, state push, import, init -migrate-state)
/// leaves an operation the console and the CLI word as the command a person typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operations_terraform_records_read_as_its_commands() {
    use crate::terraform::{Cli, terraform_binary, tofu_binary, transcript};
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let backend = TestBackend::start(&url, &[]).await;
    let admin = Client::new(&backend.url);
    let resources = "resource \"terraform_data\" \"a\" {\n  input = \"a\"\n}\nresource \"terraform_data\" \"b\" {\n  input = \"b\"\n}\n";
    for (label, cli) in [
        ("terraform", Cli::new(terraform_binary())),
        ("tofu", Cli::new(tofu_binary())),
    ] {
        let name = format!("ops/{label}.tfstate");
        let work = tempfile::tempdir().expect("tempdir");
        let dir = work.path();
        // Created locally first, then migrated: `init -migrate-state`.
        std::fs::write(dir.join("main.tf"), resources).expect("main.tf");
        let run = |args: &'static [&'static str]| {
            let cli = &cli;
            async move {
                let out = cli.run(dir, args).await;
                assert!(
                    out.status.success(),
                    "{label} {args:?}:\n{}",
                    transcript(&out)
                );
                out
            }
        };
        run(&["init", "-no-color"]).await;
        run(&["apply", "-auto-approve", "-no-color"]).await;
        let block = gitstate_tests::terraform_backend_block(&backend.url, &name, "");
        std::fs::write(dir.join("backend.tf"), block).expect("backend.tf");
        run(&["init", "-migrate-state", "-force-copy", "-no-color"]).await;
        run(&[
            "apply",
            "-auto-approve",
            "-no-color",
            "-replace=terraform_data.a",
        ])
        .await;
        run(&["taint", "-no-color", "terraform_data.a"]).await;
        run(&["untaint", "-no-color", "terraform_data.a"]).await;
        run(&[
            "state",
            "mv",
            "-no-color",
            "terraform_data.b",
            "terraform_data.c",
        ])
        .await;
        run(&["state", "rm", "-no-color", "terraform_data.c"]).await;
        // terraform_data takes any ID to import.
        run(&[
            "import",
            "-no-color",
            "terraform_data.b",
            "00000000-0000-0000-0000-000000000001",
        ])
        .await;
        let pulled = run(&["state", "pull"]).await;
        let mut state: Value = serde_json::from_slice(&pulled.stdout).expect("state JSON");
        state["serial"] = json!(state["serial"].as_u64().expect("serial") + 1);
        std::fs::write(dir.join("pushed.tfstate"), state.to_string()).expect("write");
        run(&["state", "push", "-no-color", "pushed.tfstate"]).await;

        let history = admin
            .send("GET", &format!("/history/{name}?per_page=100"), None)
            .await
            .expect(200)
            .json();
        let recorded: Vec<String> = history["versions"]
            .as_array()
            .expect("versions")
            .iter()
            .rev()
            .map(|v| v["operation"].as_str().expect("operation").to_owned())
            .collect();
        let shown: Vec<String> = recorded
            .iter()
            .map(|op| gitstate_core::wording::operation(op))
            .collect();
        let expected = [
            "migration",
            "apply",
            "taint",
            "untaint",
            "state mv",
            "state rm",
            "import",
            "state push",
        ];
        assert_eq!(shown, expected, "{label} recorded {recorded:?}");
        eprintln!("{label}: {recorded:?} read as {shown:?}");
    }
}
