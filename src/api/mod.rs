//! HTTP routers, one module per resource. Handlers are thin: they extract,
//! authorise, call a service and map the result.

mod contexts;
pub mod decode;
pub mod error;
pub mod error_body;
pub mod extract;
mod health;
pub mod json;
mod pools;
mod workloads;

pub use error::{ApiError, ApiResult};
pub use error_body::ErrorBody;

use axum::routing::get;
use axum::{middleware, Router};
use tower_http::trace::TraceLayer;

use crate::app::AppState;
use crate::metrics;

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(health::router())
        .merge(pools::router())
        .merge(contexts::router())
        .merge(workloads::router())
        .route("/metrics", get(metrics::render))
        // Last, so it wraps every route above.
        .route_layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            metrics::track,
        ))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
