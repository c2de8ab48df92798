//! The wire a git conversation travels on: [`Wire`], one trait for smart HTTP(S) ([`http`]) and
//! SSH ([`ssh`]), each giving the ref advertisement of a service and one request/response
//! exchange, refused once an answer passes the size limit. What the bytes mean is the
//! [`crate::protocol`]'s business.

pub mod http;
pub mod ssh;

use crate::Error;

pub use http::{Connection, Http, private_roots, same_origin};
pub use ssh::Ssh;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    UploadPack,
    ReceivePack,
}

impl Service {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::UploadPack => "git-upload-pack",
            Self::ReceivePack => "git-receive-pack",
        }
    }
}

#[async_trait::async_trait]
pub trait Wire: Send + Sync {
    /// The ref advertisement of `service`: its pkt-lines of refs and capabilities up to and
    /// including the flush that ends them.
    async fn advertise(&self, service: Service, limit: u64) -> Result<Vec<u8>, Error>;

    /// One request to `service` and its whole response.
    async fn exchange(
        &self,
        service: Service,
        request: Vec<u8>,
        limit: u64,
    ) -> Result<Vec<u8>, Error>;

    /// Whether this wire carries protocol v2 (a fetch of blobs by id needs it).
    fn carries_v2(&self) -> bool {
        false
    }

    /// One protocol-v2 upload-pack request and its response.
    async fn exchange_v2(&self, _request: Vec<u8>, _limit: u64) -> Result<Vec<u8>, Error> {
        Err(Error::Protocol(
            "protocol v2 is not spoken over this wire".into(),
        ))
    }
}

/// The wire to `url`: SSH for `ssh://…` and `user@host:path`, smart HTTP(S) otherwise.
pub fn connect(url: &str, connection: &Connection<'_>) -> Result<Box<dyn Wire>, Error> {
    if ssh::is_ssh(url) {
        return Ok(Box::new(Ssh::parse(url, connection.timeout)?));
    }
    Ok(Box::new(Http::new(url, connection)?))
}
