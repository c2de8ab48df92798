//! A small HTTP client for a gitstate backend, with one method per route and answers that state
//! the status they must have: `client.get_state(NAME).await.expect(200).state()`.

use http::HeaderMap;
use serde::Deserialize;

use crate::{TEST_PASSWORD, TEST_USER, lock_info};

/// A client sending Basic credentials (the test admin's unless told otherwise).
pub struct Client {
    http: reqwest::Client,
    base: String,
    credentials: Option<(String, String)>,
}

/// Status, headers and body of a response.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

/// The parts of a Terraform state the tests look at.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TfState {
    pub serial: u64,
    pub lineage: String,
}

/// A LockInfo as the backend answers `GET /locks/<name>` and a 423 with it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Lock {
    #[serde(rename = "ID")]
    pub id: String,
    pub operation: String,
    pub who: String,
}

/// A history page and its revisions: the wire types the server writes and the CLI reads.
pub use gitstate_core::api::{HistoryAnswer as History, VersionInfo as Version};

impl Answer {
    /// The answer, when it has `status`; otherwise the test fails naming both and the body.
    #[track_caller]
    pub fn expect(self, status: u16) -> Self {
        assert_eq!(
            self.status, status,
            "expected {status}, got {}: {}",
            self.status, self.body
        );
        self
    }

    /// The body as JSON (the test fails when it is not).
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        self.parse()
    }

    /// The body as a Terraform state.
    #[track_caller]
    pub fn state(&self) -> TfState {
        self.parse()
    }

    /// The body as a LockInfo.
    #[track_caller]
    pub fn lock(&self) -> Lock {
        self.parse()
    }

    /// The body as a history page.
    #[track_caller]
    pub fn history(&self) -> History {
        self.parse()
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    #[track_caller]
    fn parse<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not a {} ({e}): {}", std::any::type_name::<T>(), self.body))
    }
}

impl Client {
    pub fn new(base: &str) -> Self {
        Self::with_credentials(base, Some((TEST_USER, TEST_PASSWORD)))
    }

    pub fn with_credentials(base: &str, credentials: Option<(&str, &str)>) -> Self {
        Self {
            // A connection idle for 5 s is dropped here before `gitstate serve` closes it (at
            // its 10 s header timeout): reusing one the server is closing at that moment fails
            // the request (`IncompleteMessage`), a race of the harness, not of the backend.
            http: reqwest::Client::builder()
                .pool_idle_timeout(std::time::Duration::from_secs(5))
                .build()
                .expect("HTTP client"),
            base: base.trim_end_matches('/').to_owned(),
            credentials: credentials.map(|(u, p)| (u.to_owned(), p.to_owned())),
        }
    }

    /// Send with a raw `Authorization` header (or none), for tests of malformed ones.
    pub async fn send_with_authorization(
        &self,
        method: &str,
        path: &str,
        authorization: Option<&[u8]>,
    ) -> (u16, HeaderMap, String) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(value) = authorization {
            request = request.header(
                "authorization",
                http::HeaderValue::from_bytes(value).expect("header value"),
            );
        }
        let response = request.send().await.expect("backend answers");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        (status, headers, response.text().await.unwrap_or_default())
    }

    pub async fn send(&self, method: &str, path: &str, body: Option<&str>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some((user, password)) = &self.credentials {
            request = request.basic_auth(user, Some(password));
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let response = request.send().await.expect("backend answers");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        Answer {
            status,
            headers,
            body: response.text().await.unwrap_or_default(),
        }
    }

    /// `GET /states/<name>`.
    pub async fn get_state(&self, name: &str) -> Answer {
        self.send("GET", &format!("/states/{name}"), None).await
    }

    /// `POST /states/<name>` without a lock ID.
    pub async fn write(&self, name: &str, state: &str) -> Answer {
        self.send("POST", &format!("/states/{name}"), Some(state))
            .await
    }

    /// `POST /states/<name>?ID=<id>`, as Terraform writes under its lock.
    pub async fn write_locked(&self, name: &str, id: &str, state: &str) -> Answer {
        self.send("POST", &format!("/states/{name}?ID={id}"), Some(state))
            .await
    }

    /// `DELETE /states/<name>`, with `?ID=` when given.
    pub async fn delete_state(&self, name: &str, id: Option<&str>) -> Answer {
        let query = id.map(|id| format!("?ID={id}")).unwrap_or_default();
        self.send("DELETE", &format!("/states/{name}{query}"), None)
            .await
    }

    /// `POST /locks/<name>` with a LockInfo of `id`.
    pub async fn lock(&self, name: &str, id: &str) -> Answer {
        let body = lock_info(id);
        self.send("POST", &format!("/locks/{name}"), Some(&body))
            .await
    }

    /// `DELETE /locks/<name>` with a LockInfo of `id`.
    pub async fn unlock(&self, name: &str, id: &str) -> Answer {
        let body = lock_info(id);
        self.send("DELETE", &format!("/locks/{name}"), Some(&body))
            .await
    }

    /// `DELETE /locks/<name>` with an empty body: Terraform's force-unlock.
    pub async fn force_unlock(&self, name: &str) -> Answer {
        self.send("DELETE", &format!("/locks/{name}"), Some(""))
            .await
    }

    /// `GET /locks/<name>`.
    pub async fn get_lock(&self, name: &str) -> Answer {
        self.send("GET", &format!("/locks/{name}"), None).await
    }

    /// What one `terraform apply` does: lock with `id`, write `state` under the lock, read it
    /// back byte for byte, unlock; each step must succeed.
    pub async fn apply(&self, name: &str, id: &str, state: &str) {
        self.lock(name, id).await.expect(200);
        self.write_locked(name, id, state).await.expect(200);
        let read = self.get_state(name).await.expect(200);
        assert_eq!(read.body, state, "{name} reads back what was written");
        self.unlock(name, id).await.expect(200);
    }

    /// `POST /history/<name>?restore=<at>` (a serial or a commit).
    pub async fn restore(&self, name: &str, at: &str) -> Answer {
        self.send("POST", &format!("/history/{name}?restore={at}"), None)
            .await
    }

    /// `GET /locks`: every lock the caller may see.
    pub async fn list_locks(&self) -> Answer {
        self.send("GET", "/locks", None).await
    }

    /// `GET /history/<name>` with `query` (`""`, `per_page=5`, `at=<commit>`, …).
    pub async fn history(&self, name: &str, query: &str) -> Answer {
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        self.send("GET", &format!("/history/{name}{query}"), None)
            .await
    }
}
