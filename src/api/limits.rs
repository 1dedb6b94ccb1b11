//! Per-request time limits, so a slow or stalled client cannot hold a
//! handler forever: a request body that goes quiet ends the request with
//! `408 request_timeout`, and a non-streaming request that runs past the
//! deadline ends with `503 deadline_exceeded`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use tower_http::timeout::{TimeoutBody, TimeoutError};

use super::error::{ApiError, Code};

/// Time limits of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Longest wait for the next piece of a request body.
    pub body_idle_timeout: Duration,
    /// Longest time a non-streaming request may take until its answer.
    pub deadline: Duration,
}

/// Routes whose handlers stream a body of any length, so a total deadline
/// would cut legitimate transfers; the body idle timeout still applies.
const STREAMING_ROUTES: &[(Method, &str)] = &[
    (Method::PUT, "/v1/workloads/{name}/bundle"),
    (Method::PUT, "/v1/uploads/{grant}"),
    (
        Method::GET,
        "/v1/workloads/{name}/revisions/{revision}/bundle",
    ),
    // The trusted export (`api::trusted`).
    (
        Method::GET,
        "/internal/v1/namespaces/{namespace}/contexts/{name}/revisions/{revision}/bundle",
    ),
];

/// Deliveries into sandboxes and their release: each sandbox is bounded by
/// `--delivery-timeout` (minutes for a large bundle), not by the request
/// deadline meant for calls that only touch the store.
const DELIVERY_ROUTES: &[(Method, &str)] = &[
    (Method::POST, "/v1/workloads/{name}/deliveries"),
    (Method::DELETE, "/v1/workloads/{name}/deliveries/{run}"),
];

/// The pool read that long-polls with `?wait=ready` (capped by the pool
/// service's own maximum wait).
const LONG_POLL_ROUTE: &str = "/v1/sandbox-pools/{name}";

/// Middleware: every read of the request body waits at most
/// `body_idle_timeout` for the next frame. When it times out, the handler
/// sees a body error (and fails however it fails); the answer is then
/// replaced by `408 request_timeout` and the connection closed, since the
/// rest of the body was never read.
pub(super) async fn body_idle_timeout(
    State(limits): State<RequestLimits>,
    request: Request,
    next: Next,
) -> Response {
    let idle = limits.body_idle_timeout;
    let stalled = Arc::new(AtomicBool::new(false));
    let seen = stalled.clone();
    let request = request.map(|body| {
        Body::new(TimeoutBody::new(idle, body).map_err(move |e| {
            if e.is::<TimeoutError>() {
                seen.store(true, Ordering::Relaxed);
            }
            e
        }))
    });
    let response = next.run(request).await;
    if !stalled.load(Ordering::Relaxed) {
        return response;
    }
    let mut response = ApiError::new(
        Code::RequestTimeout,
        format!(
            "no part of the request body arrived for {}",
            humantime::format_duration(idle)
        ),
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Middleware: a request that is neither a bundle transfer nor a
/// long-poll must produce its answer within `deadline`; otherwise its
/// handler is dropped and the answer is `503 deadline_exceeded`.
pub(super) async fn deadline(
    State(limits): State<RequestLimits>,
    request: Request,
    next: Next,
) -> Response {
    if is_exempt(&request) {
        return next.run(request).await;
    }
    match tokio::time::timeout(limits.deadline, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            Code::DeadlineExceeded,
            format!(
                "the request did not finish within {}",
                humantime::format_duration(limits.deadline)
            ),
        )
        .into_response(),
    }
}

/// Whether `request` streams a bundle, delivers or long-polls (see
/// [`STREAMING_ROUTES`], [`DELIVERY_ROUTES`], [`LONG_POLL_ROUTE`]).
fn is_exempt(request: &Request) -> bool {
    let Some(route) = request.extensions().get::<MatchedPath>() else {
        return false;
    };
    let route = route.as_str();
    let method = request.method();
    if STREAMING_ROUTES
        .iter()
        .chain(DELIVERY_ROUTES)
        .any(|(m, r)| m == method && *r == route)
    {
        return true;
    }
    route == LONG_POLL_ROUTE
        && method == Method::GET
        && request.uri().query().is_some_and(|q| {
            q.split('&')
                .any(|pair| pair.split('=').next() == Some("wait"))
        })
}
