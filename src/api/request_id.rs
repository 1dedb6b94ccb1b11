//! `x-request-id`: accepted from the client when it is usable, generated
//! (a UUID) otherwise, returned on every answer, and recorded on the
//! request's tracing span so that every log line of the request carries it.

use axum::extract::Request;
use std::time::Duration;

use axum::http::header::HeaderName;
use axum::http::StatusCode;
use axum::middleware;
use axum::Router;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::{Level, Span};

/// The header.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest inbound id kept; longer ones are replaced (they would bloat every
/// log line of the request).
pub const MAX_LEN: usize = 128;

/// Whether a client's id is kept: 1 to [`MAX_LEN`] visible ASCII characters
/// (no spaces or control characters, which could forge log fields).
pub fn is_usable(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_LEN && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// Wraps `router` (outermost first): unusable inbound ids are dropped, a
/// missing id is generated, the request runs in an `info` span `request`
/// with `method`, `path` and `request_id`, which ends with one `info` line
/// (status, latency) and, for a `5xx`, one more line ([`log_failure`]), and
/// the answer carries the id.
pub fn layer(router: Router) -> Router {
    let trace = TraceLayer::new_for_http()
        .make_span_with(|req: &Request| {
            let id = req
                .headers()
                .get(&X_REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            // The path only: a query could carry something secret.
            tracing::info_span!(
                "request",
                method = %req.method(),
                path = %req.uri().path(),
                request_id = %id,
            )
        })
        .on_response(DefaultOnResponse::new().level(Level::INFO))
        .on_failure(log_failure);
    router
        .layer(PropagateRequestIdLayer::new(X_REQUEST_ID))
        .layer(trace)
        .layer(SetRequestIdLayer::new(X_REQUEST_ID, MakeRequestUuid))
        .layer(middleware::map_request(drop_unusable))
}

/// A `503` is the service declining work for now (unready, shutting down,
/// out of temporary space, past a deadline), as `/readyz` answers every
/// probe during the shutdown grace: `warn`. Other failures are faults:
/// `error`, as tower-http's default.
fn log_failure(class: ServerErrorsFailureClass, latency: Duration, _span: &Span) {
    let latency_ms = latency.as_millis();
    match class {
        ServerErrorsFailureClass::StatusCode(StatusCode::SERVICE_UNAVAILABLE) => {
            tracing::warn!(classification = %class, latency_ms, "service unavailable");
        }
        _ => tracing::error!(classification = %class, latency_ms, "response failed"),
    }
}

/// Removes inbound ids that are not [`is_usable`], or repeated, so that one
/// is generated instead.
async fn drop_unusable(mut req: Request) -> Request {
    let mut ids = req.headers().get_all(&X_REQUEST_ID).iter();
    let keep = match (ids.next(), ids.next()) {
        (Some(id), None) => is_usable(id.as_bytes()),
        (None, _) => true,
        (Some(_), Some(_)) => false,
    };
    if !keep {
        req.headers_mut().remove(&X_REQUEST_ID);
    }
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_ids_are_short_visible_ascii() {
        assert!(is_usable(b"abc-123"));
        assert!(is_usable(&[b'y'; MAX_LEN]));
        assert!(is_usable(b"!~"));
        assert!(!is_usable(&[b'y'; MAX_LEN + 1]));
        assert!(!is_usable(b""));
        assert!(!is_usable(b"a b"));
        assert!(!is_usable(b"a\tb"));
        assert!(!is_usable("é".as_bytes()));
        assert!(!is_usable(b"a\x7f"));
    }
}
