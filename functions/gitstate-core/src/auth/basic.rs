//! `Authorization: Basic …` headers.

use base64::Engine as _;

use crate::secret::Secret;

/// Longest `Authorization` header looked at.
pub const MAX_AUTHORIZATION_BYTES: usize = 4096;

/// Why a header did not yield credentials (for the debug log only; the client sees 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BasicError {
    #[error("no Authorization header")]
    Missing,
    #[error("Authorization header longer than {MAX_AUTHORIZATION_BYTES} bytes")]
    TooLong,
    #[error("Authorization scheme is not Basic")]
    Scheme,
    #[error("Basic credentials are not valid base64")]
    Base64,
    #[error("Basic credentials are not UTF-8")]
    Utf8,
    #[error("Basic credentials have no ':' between user and password")]
    NoColon,
    #[error("Basic credentials have an empty user or password")]
    Empty,
}

/// Decode `Basic base64(user:password)`.
pub fn parse_basic(header: Option<&[u8]>) -> Result<(String, Secret), BasicError> {
    let header = header.ok_or(BasicError::Missing)?;
    if header.len() > MAX_AUTHORIZATION_BYTES {
        return Err(BasicError::TooLong);
    }
    let text = std::str::from_utf8(header).map_err(|_| BasicError::Scheme)?;
    let (scheme, encoded) = text.trim().split_once(' ').ok_or(BasicError::Scheme)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(BasicError::Scheme);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| BasicError::Base64)?;
    let decoded = String::from_utf8(decoded).map_err(|_| BasicError::Utf8)?;
    let (user, password) = decoded.split_once(':').ok_or(BasicError::NoColon)?;
    if user.is_empty() || password.is_empty() {
        return Err(BasicError::Empty);
    }
    Ok((user.to_owned(), Secret::new(password.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, password: &str) -> Vec<u8> {
        let raw = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {raw}").into_bytes()
    }

    #[test]
    fn basic_header_parsing() {
        assert_eq!(
            parse_basic(Some(&header("alice", "pw:with:colons")))
                .map(|(u, s)| (u, s.expose().to_owned())),
            Ok(("alice".into(), "pw:with:colons".into()))
        );
        assert_eq!(parse_basic(None), Err(BasicError::Missing));
        assert_eq!(parse_basic(Some(b"Bearer abc")), Err(BasicError::Scheme));
        assert_eq!(parse_basic(Some(b"Basic !!!")), Err(BasicError::Base64));
        assert_eq!(parse_basic(Some(b"Basic /w==")), Err(BasicError::Utf8));
        assert_eq!(
            parse_basic(Some(b"Basic bm9jb2xvbg==")),
            Err(BasicError::NoColon)
        );
        assert_eq!(parse_basic(Some(b"Basic OnB3")), Err(BasicError::Empty));
        assert_eq!(parse_basic(Some(b"Basic")), Err(BasicError::Scheme));
        assert_eq!(
            parse_basic(Some(&vec![b'a'; MAX_AUTHORIZATION_BYTES + 1])),
            Err(BasicError::TooLong)
        );
        assert_eq!(parse_basic(Some(b"\xff\xfe")), Err(BasicError::Scheme));
    }
}
