//! Request bodies decoded the way the upstream Go service decodes them, and
//! JSON answers written the way it writes them.
//!
//! Upstream uses `encoding/json` with unknown fields disallowed: only the
//! first JSON value is read (trailing data ignored), keys match
//! case-insensitively, `null` leaves a field at its zero value, and errors
//! have Go's wording (`json: unknown field "x"`, `EOF`, ...). Clients rely on
//! those messages, so they are kept.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use serde::Serialize;
use serde_json::{Map, Value};

use super::error::ApiError;

/// Largest body read, as upstream's `http.MaxBytesReader`.
pub const MAX_BODY: usize = 1 << 20;

/// Reads the first JSON value of `body` (at most [`MAX_BODY`] bytes of it).
pub async fn read_first_value(body: Body) -> Result<Value, ApiError> {
    let mut body = body;
    let mut buf = Vec::new();
    let mut too_large = false;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::invalid_request(format!("reading the body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            let room = MAX_BODY - buf.len();
            if data.len() > room {
                buf.extend_from_slice(&data[..room]);
                too_large = true;
                break;
            }
            buf.extend_from_slice(&data);
        }
    }
    first_value(&buf, too_large)
}

/// The first JSON value of `buf`, the body read so far; `truncated` when
/// the body went on past [`MAX_BODY`].
pub fn first_value(buf: &[u8], truncated: bool) -> Result<Value, ApiError> {
    let mut values = serde_json::Deserializer::from_slice(buf).into_iter::<Value>();
    match values.next() {
        Some(Ok(value)) => Ok(value),
        // The first value did not end within the limit.
        _ if truncated => Err(ApiError::invalid_request("http: request body too large")),
        None => Err(ApiError::invalid_request("EOF")),
        Some(Err(e)) if e.is_eof() => Err(ApiError::invalid_request("unexpected EOF")),
        Some(Err(e)) => Err(ApiError::invalid_request(syntax_message(buf, &e))),
    }
}

fn syntax_message(buf: &[u8], err: &serde_json::Error) -> String {
    // Go names the offending character; find it from serde's position.
    let offset = buf
        .split(|&b| b == b'\n')
        .take(err.line().saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum::<usize>()
        + err.column().saturating_sub(1);
    match buf.get(offset) {
        Some(&b) if b.is_ascii_graphic() => format!("invalid character '{}' in JSON", b as char),
        _ => format!("invalid JSON: {err}"),
    }
}

/// The Go name of a JSON value's kind, for type-error messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Walks one JSON object, matching keys case-insensitively against the
/// struct's fields and rejecting unknown ones.
pub struct Fields<'a> {
    entries: Vec<(&'a str, &'a Value)>,
    /// Go struct name, e.g. `CreateRequest`.
    go_struct: &'static str,
    /// JSON path prefix of nested structs, e.g. `workspace.`.
    prefix: &'static str,
}

impl<'a> Fields<'a> {
    /// The fields of a top-level value; `go_type` names it in errors
    /// (`pool.CreateRequest`). `null` is an empty object.
    pub fn top(
        value: &'a Value,
        go_type: &'static str,
        go_struct: &'static str,
    ) -> Result<Self, ApiError> {
        Self::of(value, go_struct, "", || {
            format!(
                "json: cannot unmarshal {} into Go value of type {go_type}",
                kind(value)
            )
        })
    }

    /// The fields of the nested object `field` (already looked up).
    pub fn nested(
        value: &'a Value,
        parent: &'static str,
        field: &'static str,
        go_struct: &'static str,
        prefix: &'static str,
    ) -> Result<Self, ApiError> {
        Self::of(value, go_struct, prefix, || {
            format!(
                "json: cannot unmarshal {} into Go struct field {parent}.{field} of type {go_struct}",
                kind(value)
            )
        })
    }

    fn of(
        value: &'a Value,
        go_struct: &'static str,
        prefix: &'static str,
        mismatch: impl FnOnce() -> String,
    ) -> Result<Self, ApiError> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        let map = match value {
            Value::Object(map) => map,
            Value::Null => EMPTY.get_or_init(Map::new),
            _ => return Err(ApiError::invalid_request(mismatch())),
        };
        Ok(Self {
            entries: map.iter().map(|(k, v)| (k.as_str(), v)).collect(),
            go_struct,
            prefix,
        })
    }

    /// Fails on the first key that is none of `known` (case-insensitively).
    pub fn deny_unknown(&self, known: &[&str]) -> Result<(), ApiError> {
        for (key, _) in &self.entries {
            if !known.iter().any(|k| k.eq_ignore_ascii_case(key)) {
                return Err(ApiError::invalid_request(format!(
                    "json: unknown field {key:?}"
                )));
            }
        }
        Ok(())
    }

    /// The value of `name` (the last matching key wins, as in Go); `None`
    /// when absent or `null`.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
            .filter(|v| !v.is_null())
    }

    fn type_error(&self, name: &str, value: &Value, go_type: &str) -> ApiError {
        let what = match (value, go_type) {
            (Value::Number(n), "int") => format!("number {n}"),
            _ => kind(value).to_owned(),
        };
        ApiError::invalid_request(format!(
            "json: cannot unmarshal {what} into Go struct field {}.{}{name} of type {go_type}",
            self.go_struct, self.prefix
        ))
    }

    /// A string field; `""` when absent.
    pub fn string(&self, name: &str) -> Result<String, ApiError> {
        match self.get(name) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(self.type_error(name, other, "string")),
        }
    }

    /// An integer field (Go `int`, 64 bits); `0` when absent.
    pub fn int(&self, name: &str) -> Result<i64, ApiError> {
        match self.get(name) {
            None => Ok(0),
            Some(Value::Number(n)) => n
                .as_i64()
                .ok_or_else(|| self.type_error(name, &Value::Number(n.clone()), "int")),
            Some(other) => Err(self.type_error(name, other, "int")),
        }
    }

    /// A boolean field that may be absent (`None` also for `null`).
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.type_error(name, other, "bool")),
        }
    }
}

/// A path parameter, or `400 invalid_request` (e.g. invalid UTF-8 after
/// percent-decoding) as JSON rather than axum's plain-text rejection.
pub fn path_param<T>(
    path: Result<axum::extract::Path<T>, axum::extract::rejection::PathRejection>,
) -> Result<T, ApiError> {
    path.map(|axum::extract::Path(v)| v)
        .map_err(|e| ApiError::invalid_request(e.body_text()))
}

/// A JSON answer with a trailing newline, as upstream writes it.
pub fn respond<T: Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(mut bytes) => {
            bytes.push(b'\n');
            (
                status,
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                bytes,
            )
                .into_response()
        }
        Err(e) => ApiError::internal(format!("encoding an answer: {e}")).into_response(),
    }
}
