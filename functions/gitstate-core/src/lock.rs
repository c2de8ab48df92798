//! Terraform's LockInfo, kept as the client sent it.

use bytes::Bytes;
use serde_json::Value;

/// Largest LockInfo a LOCK may send. Terraform's and OpenTofu's are a few hundred bytes; the
/// lock commit keeps the body byte for byte, and every list fetches every lock commit whatever
/// its caller may read, so one writer's oversized locks would cost every user's lists.
pub const MAX_LOCK_INFO_BYTES: usize = 64 * 1024;

/// A lock request or a held lock: the client's JSON, byte for byte, plus the fields we read.
///
/// Terraform treats the body as opaque apart from `ID`, and so do we: the stored lock file is
/// exactly what the holder sent, and a conflict answers with those bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    raw: Bytes,
    id: String,
    who: String,
    operation: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockInfoError {
    #[error("lock info is not valid JSON: {0}")]
    Json(String),
    #[error("lock info must be a JSON object")]
    NotAnObject,
    #[error("lock info has no non-empty string \"ID\"")]
    MissingId,
    #[error("lock info is {size} bytes; at most {MAX_LOCK_INFO_BYTES} are taken")]
    TooLarge { size: usize },
}

impl LockInfo {
    pub fn parse(raw: Bytes) -> Result<Self, LockInfoError> {
        let value: Value =
            serde_json::from_slice(&raw).map_err(|e| LockInfoError::Json(e.to_string()))?;
        let object = value.as_object().ok_or(LockInfoError::NotAnObject)?;
        let field = |key: &str| {
            object
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let id = field("ID");
        if id.is_empty() {
            return Err(LockInfoError::MissingId);
        }
        Ok(Self {
            id,
            who: field("Who"),
            operation: field("Operation"),
            raw,
        })
    }

    /// The LockInfo a LOCK sends: as [`Self::parse`], within [`MAX_LOCK_INFO_BYTES`]. (Locks
    /// already held are read whatever their size: they must stay releasable.)
    pub fn parse_sent(raw: Bytes) -> Result<Self, LockInfoError> {
        if raw.len() > MAX_LOCK_INFO_BYTES {
            return Err(LockInfoError::TooLarge { size: raw.len() });
        }
        Self::parse(raw)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn who(&self) -> &str {
        &self.who
    }

    pub fn operation(&self) -> &str {
        &self.operation
    }

    pub fn as_bytes(&self) -> &Bytes {
        &self.raw
    }
}

/// What an unlock request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnlockRequest {
    /// Release the lock only if it has this ID (normal unlock, OpenTofu's force-unlock).
    Id(String),
    /// Terraform's `force-unlock`: it sends no body at all, so the ID cannot be checked.
    Force,
}

impl UnlockRequest {
    pub fn parse(body: &[u8]) -> Result<Self, LockInfoError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::Force);
        }
        match LockInfo::parse(Bytes::copy_from_slice(body)) {
            Ok(info) => Ok(Self::Id(info.id)),
            Err(LockInfoError::MissingId) => Ok(Self::Force),
            Err(other) => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_raw_bytes_and_reads_fields() {
        let raw = Bytes::from_static(
            br#"{"ID":"a-1","Operation":"OperationTypeApply","Who":"me@host","Extra":[1]}"#,
        );
        let info = LockInfo::parse(raw.clone()).expect("valid lock info");
        assert_eq!(
            (info.id(), info.who(), info.operation()),
            ("a-1", "me@host", "OperationTypeApply")
        );
        assert_eq!(info.as_bytes(), &raw);
    }

    /// A sent LockInfo of exactly the limit is taken, one byte more is not; a held lock of any
    /// size is still read (so it can be released).
    #[test]
    fn sent_lock_info_is_bounded_and_held_locks_are_not() {
        let sized = |size: usize| {
            let frame = r#"{"ID":"a-1","Info":""}"#;
            let pad = "x".repeat(size - frame.len());
            Bytes::from(format!(r#"{{"ID":"a-1","Info":"{pad}"}}"#))
        };
        for size in [100, MAX_LOCK_INFO_BYTES - 1, MAX_LOCK_INFO_BYTES] {
            let raw = sized(size);
            assert_eq!(raw.len(), size);
            assert_eq!(
                LockInfo::parse_sent(raw).expect("within the limit").id(),
                "a-1"
            );
        }
        for size in [MAX_LOCK_INFO_BYTES + 1, 6 << 20] {
            assert_eq!(
                LockInfo::parse_sent(sized(size)),
                Err(LockInfoError::TooLarge { size })
            );
            assert_eq!(LockInfo::parse(sized(size)).expect("held").id(), "a-1");
        }
    }

    #[test]
    fn refuses_bad_lock_bodies() {
        assert!(matches!(
            LockInfo::parse(Bytes::from_static(b"{")),
            Err(LockInfoError::Json(_))
        ));
        assert_eq!(
            LockInfo::parse(Bytes::from_static(b"[1]")),
            Err(LockInfoError::NotAnObject)
        );
        assert_eq!(
            LockInfo::parse(Bytes::from_static(br#"{"ID":""}"#)),
            Err(LockInfoError::MissingId)
        );
        assert_eq!(
            LockInfo::parse(Bytes::from_static(br#"{"ID":7}"#)),
            Err(LockInfoError::MissingId)
        );
    }

    #[test]
    fn unlock_bodies() {
        assert_eq!(UnlockRequest::parse(b""), Ok(UnlockRequest::Force));
        assert_eq!(UnlockRequest::parse(b" \n"), Ok(UnlockRequest::Force));
        assert_eq!(
            UnlockRequest::parse(br#"{"ID":"x","Who":""}"#),
            Ok(UnlockRequest::Id("x".into()))
        );
        assert_eq!(
            UnlockRequest::parse(br#"{"ID":""}"#),
            Ok(UnlockRequest::Force)
        );
        assert!(UnlockRequest::parse(b"nope").is_err());
    }
}
