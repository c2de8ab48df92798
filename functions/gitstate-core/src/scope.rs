//! What a store may know of the request it serves, set once per request by the HTTP layer.
//!
//! - When the request began: an answer from the remote made since then already reflects every
//!   write that finished before the request was sent, so a second look within the same request
//!   (the state after the access file) may reuse it without weakening read-after-write.
//! - The state a read asks for: when the access file has to be fetched first, the state's blob
//!   can come in the same request as the access file's.

use std::future::Future;
use std::time::Instant;

use crate::StateName;

tokio::task_local! {
    static CURRENT: Scope;
}

#[derive(Debug, Clone)]
pub struct Scope {
    pub began: Instant,
    /// The state a `GET` of the configured location reads, if that is what the request is.
    pub reads: Option<StateName>,
}

impl Scope {
    /// Run `work` within this scope.
    pub async fn run<F: Future>(self, work: F) -> F::Output {
        CURRENT.scope(self, work).await
    }

    /// The scope of the request being served, if any.
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_scope_is_seen_inside_and_not_outside() {
        assert!(Scope::current().is_none());
        let name = StateName::parse("a/b.tfstate").expect("a name");
        let began = Instant::now();
        let seen = Scope {
            began,
            reads: Some(name.clone()),
        }
        .run(async { Scope::current() })
        .await
        .expect("inside");
        assert_eq!((seen.began, seen.reads), (began, Some(name)));
        assert!(Scope::current().is_none());
    }
}
