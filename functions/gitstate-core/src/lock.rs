//! Terraform's LockInfo, kept as the client sent it.

use bytes::Bytes;
use serde_json::Value;

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
