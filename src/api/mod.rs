//! HTTP routers, one module per resource. Handlers are thin: they extract,
//! authorise, call a service and map the result.

mod contexts;
mod health;
pub mod json;
mod pools;

use axum::Router;
use tower_http::trace::TraceLayer;

use crate::app::AppState;

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(health::router())
        .merge(pools::router())
        .merge(contexts::router())
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
