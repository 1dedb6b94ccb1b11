//! `x-request-id`: accepted from the client when it is usable, generated
//! (a UUID) otherwise, returned on every answer, and recorded on the
//! request's tracing span so that every log line of the request carries it.

use axum::extract::Request;
use axum::http::header::HeaderName;
use axum::middleware;
use axum::Router;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;

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
/// (status, latency), and the answer carries the id.
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
        .on_response(DefaultOnResponse::new().level(Level::INFO));
    router
        .layer(PropagateRequestIdLayer::new(X_REQUEST_ID))
        .layer(trace)
        .layer(SetRequestIdLayer::new(X_REQUEST_ID, MakeRequestUuid))
        .layer(middleware::map_request(drop_unusable))
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
