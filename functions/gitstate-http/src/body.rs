//! What a request carries: the body within its limit, `Content-MD5` and the media type.

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Method, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::ApiError;

/// The body of a request that carries one (any method but GET and HEAD): of an accepted media
/// type, within `limit`, and matching its `Content-MD5` if it sends one.
pub(crate) async fn write_body(
    method: &Method,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    if matches!(*method, Method::GET | Method::HEAD) {
        return Ok(Bytes::new());
    }
    check_media_type(headers)?;
    let body = read_body(headers, body, limit).await?;
    check_content_md5(headers, &body)?;
    Ok(body)
}

pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::TooLarge { limit });
    }
    // One buffer of the declared size, filled frame by frame: collecting the frames first and
    // joining them after would hold every large state twice.
    let declared = declared.and_then(|d| usize::try_from(d).ok()).unwrap_or(0);
    let mut buffer = Vec::with_capacity(declared.min(limit));
    let mut body = Limited::new(body, limit);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                ApiError::TooLarge { limit }
            } else {
                ApiError::BodyRead
            }
        })?;
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buffer))
}

/// RFC 1864: when a request carries `Content-MD5` (Terraform sends it with every body), it must
/// be the base64 of the body's MD5, or the request changes nothing.
fn check_content_md5(headers: &HeaderMap, body: &[u8]) -> Result<(), ApiError> {
    use base64::Engine;
    use md5::Digest;
    let mut values = headers.get_all("content-md5").iter();
    let Some(value) = values.next() else {
        return Ok(());
    };
    if values.next().is_some() {
        return Err(ApiError::ContentMd5("is given twice"));
    }
    let sent = base64::engine::general_purpose::STANDARD
        .decode(value.as_bytes().trim_ascii())
        .ok()
        .filter(|digest| digest.len() == 16)
        .ok_or(ApiError::ContentMd5(
            "is not the base64 of a 16-byte MD5 digest",
        ))?;
    if sent.as_slice() != md5::Md5::digest(body).as_slice() {
        return Err(ApiError::ContentMd5(
            "does not match the body (corrupted in transit?)",
        ));
    }
    Ok(())
}

fn check_media_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::MediaType("<not ASCII>".into()))?;
    let essence = text
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence.is_empty() {
        Ok(())
    } else {
        Err(ApiError::MediaType(text.chars().take(100).collect()))
    }
}
