//! HTTP routers, one module per resource. Handlers are thin: they extract,
//! authorise, call a service and map the result.

mod body;
mod contexts;
mod health;
pub mod json;
mod limits;
mod pools;
mod rejection;
mod workloads;

use axum::routing::get;
use axum::{middleware, Router};
use tower_http::trace::TraceLayer;

use crate::app::AppState;
use crate::metrics;

pub use limits::RequestLimits;

/// The whole API, with `limits` applied to every route.
pub fn router(state: AppState, limits: RequestLimits) -> Router {
    Router::new()
        .merge(health::router())
        .merge(pools::router())
        .merge(contexts::router())
        .merge(workloads::router())
        .route("/metrics", get(metrics::render))
        .method_not_allowed_fallback(rejection::method_not_allowed)
        .route_layer(middleware::from_fn_with_state(limits, limits::deadline))
        .route_layer(middleware::from_fn_with_state(
            limits,
            limits::body_idle_timeout,
        ))
        // Last, so it wraps every route above and counts their timeouts.
        .route_layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            metrics::track,
        ))
        .fallback(rejection::no_route)
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
