//! Every answer of a route as a `debug` event (target [`TARGET`]): method,
//! route template, status and error code. The API tests collect them to
//! check that each answer is one the OpenAPI document lists; in production
//! the event is filtered out like any other debug event.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

/// The `tracing` target of the events.
pub const TARGET: &str = "context_service::api::answer";

/// Response extension: the `error` code of an error answer (set by
/// [`super::ApiError`] when it becomes a response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub &'static str);

/// Middleware (a route layer, so the route template is known): emits the
/// event once the answer is ready.
pub(super) async fn record(request: Request, next: Next) -> Response {
    let enabled = tracing::enabled!(target: TARGET, tracing::Level::DEBUG);
    let asked = enabled.then(|| {
        let route = request.extensions().get::<MatchedPath>().cloned();
        (request.method().clone(), route)
    });
    let response = next.run(request).await;
    if let Some((method, Some(route))) = asked {
        let code = response.extensions().get::<ErrorCode>().map_or("", |c| c.0);
        tracing::debug!(
            target: TARGET,
            method = %method,
            route = route.as_str(),
            status = response.status().as_u16(),
            code,
            "answered"
        );
    }
    response
}
