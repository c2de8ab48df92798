//! What a read may know of the request it serves. The HTTP layer makes one [`ReadContext`] per
//! request and hands it down, through the service and the access check, to the store methods
//! that read; work outside a request (the CLI's commands, folds, tests) passes
//! [`ReadContext::no_request`].
//!
//! - When the request began: an answer from the remote asked for since then already reflects
//!   every write that finished before the request was sent, so a second look within the same
//!   request (the state after the access file) may reuse it without weakening read-after-write.
//!   Outside a request no answer is reused this way.
//! - The state a read asks for: when the access file has to be fetched first, the state's blob
//!   can come in the same request as the access file's.

use std::time::Instant;

use crate::StateName;

#[derive(Debug, Clone)]
pub struct ReadContext {
    /// When the request began (`None`: no request).
    began: Option<Instant>,
    /// The state a `GET` of the configured location reads, if that is what the request is.
    reads: Option<StateName>,
}

impl ReadContext {
    /// The context of a request that began at `began` and, if it is a read of one state at the
    /// configured location, reads `reads`.
    pub fn request(began: Instant, reads: Option<StateName>) -> Self {
        Self {
            began: Some(began),
            reads,
        }
    }

    /// Outside any request: no answer of the remote is reused, no state is read along.
    pub const fn no_request() -> Self {
        Self {
            began: None,
            reads: None,
        }
    }

    /// The state the request reads, if it reads one.
    pub fn reads(&self) -> Option<&StateName> {
        self.reads.as_ref()
    }

    /// Whether an answer of the remote asked for at `asked` may serve this read again: only
    /// within a request, and only if it was asked for since the request began.
    pub fn may_reuse(&self, asked: Instant) -> bool {
        self.began.is_some_and(|began| asked >= began)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ReadContext;
    use crate::StateName;

    #[test]
    fn only_answers_asked_since_the_request_began_are_reused() {
        let began = std::time::Instant::now();
        let name = StateName::parse("a/b.tfstate").expect("a name");
        let request = ReadContext::request(began, Some(name.clone()));
        assert_eq!(request.reads(), Some(&name));
        assert!(ReadContext::request(began, None).reads().is_none());
        for millis in [0_u64, 1, 7, 1000, 86_400_000] {
            let offset = Duration::from_millis(millis);
            let later = began + offset;
            assert!(request.may_reuse(later), "{millis} ms after");
            if let Some(earlier) = began.checked_sub(offset).filter(|_| millis > 0) {
                assert!(!request.may_reuse(earlier), "{millis} ms before");
            }
            assert!(!ReadContext::no_request().may_reuse(later));
        }
        assert!(ReadContext::no_request().reads().is_none());
    }
}
