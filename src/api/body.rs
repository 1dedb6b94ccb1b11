//! Request bodies and path parameters as the handlers take them: the body
//! read within upstream's limit and decoded by [`super::json`], every
//! failure an [`ApiError`]; and JSON answers ([`respond`]).

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use http_body_util::BodyExt as _;

use super::error::ApiError;
use super::json::{decode_bytes, Decoded, GoStruct, MAX_BODY};

// Written beside the API error, whose answer it writes too (and which
// answers an encoding failure).
pub use super::error::respond;

/// Reads the first JSON value of `body` (within [`MAX_BODY`] bytes) and
/// decodes it into `schema`, as upstream's handlers do; every failure is
/// `400 invalid_request` with Go's message. The [`Overflow`] tells whether
/// the answer must close the connection (the body went past the limit).
pub async fn decode_body(
    body: Body,
    schema: &'static GoStruct,
) -> Result<(Decoded, Overflow), ApiError> {
    let (buf, complete) = read_limited(body).await?;
    let overflow = Overflow(!complete);
    match decode_bytes(&buf, complete, schema) {
        Ok(decoded) => Ok((decoded, overflow)),
        Err(message) => Err(overflow.error(ApiError::invalid_request(message))),
    }
}

/// Whether a request body went past [`MAX_BODY`]. Like Go's server, the
/// answer then says `Connection: close`; the rest of the body was read
/// (up to [`DRAIN_LIMIT`]) so the connection closes cleanly, without a
/// reset that could destroy the answer before the client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow(bool);

impl Overflow {
    /// `err`, closing the connection if the body overflowed.
    pub fn error(self, err: ApiError) -> ApiError {
        if self.0 {
            err.closing()
        } else {
            err
        }
    }

    /// `resp`, closing the connection if the body overflowed.
    pub fn response(self, mut resp: Response) -> Response {
        if self.0 {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// How much of an overflowing body is read and dropped before answering.
pub const DRAIN_LIMIT: usize = 16 << 20;

/// At most [`MAX_BODY`] bytes of `body`, and whether that was all of it
/// (the rest, if any, is drained up to [`DRAIN_LIMIT`]).
async fn read_limited(body: Body) -> Result<(Vec<u8>, bool), ApiError> {
    let mut body = body;
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::invalid_request(format!("reading the body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            let room = MAX_BODY - buf.len();
            if data.len() > room {
                buf.extend_from_slice(&data[..room]);
                drain(body, data.len() - room).await;
                return Ok((buf, false));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok((buf, true))
}

/// Reads and drops the rest of `body`, at most [`DRAIN_LIMIT`] bytes.
async fn drain(mut body: Body, mut seen: usize) {
    while seen < DRAIN_LIMIT {
        match body.frame().await {
            Some(Ok(frame)) => seen += frame.data_ref().map_or(0, bytes::Bytes::len),
            _ => return,
        }
    }
}

/// A path parameter, or its rejection as an API error (see
/// `api::rejection`).
pub fn path_param<T>(
    path: Result<axum::extract::Path<T>, axum::extract::rejection::PathRejection>,
) -> Result<T, ApiError> {
    path.map(|axum::extract::Path(v)| v).map_err(ApiError::from)
}
