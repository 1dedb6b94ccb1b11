//! HTTP routers, one module per resource. Handlers are thin: they extract,
//! authorise, call a service and map the result.

pub mod answer;
pub mod body;
pub mod challenge;
pub mod decode;
mod deliveries;
pub mod error;
pub mod error_body;
pub mod extract;
mod health;
pub mod json;
mod limits;
pub mod mux;
pub mod openapi;
mod pools;
pub mod registry;
mod rejection;
pub mod request_id;
mod trusted;
mod volumes;
mod workloads;

pub use error::{ApiError, ApiResult};
pub use error_body::ErrorBody;

use axum::handler::Handler as _;
use axum::routing::get;
use axum::{middleware, Extension, Router};
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::metrics::{self, Metrics};

pub use limits::RequestLimits;

/// Every route of the API with its OpenAPI operation: the one list the
/// router and the document are both built from. Register routes here only
/// through `routes!` (handlers with `#[utoipa::path]`): the API tests fail
/// on a route served but not documented.
fn routes(with_metrics: bool) -> OpenApiRouter<AppState> {
    let mut routes = OpenApiRouter::with_openapi(openapi::Base::openapi())
        .merge(health::router())
        .merge(pools::router())
        .merge(volumes::router())
        .merge(workloads::router())
        .merge(trusted::router())
        .merge(deliveries::router())
        .routes(routes!(openapi::serve));
    if with_metrics {
        routes = routes.routes(routes!(health::metrics));
    }
    routes
}

/// The OpenAPI document of [`router`] (what `GET /openapi.json` answers).
pub fn openapi_document(with_metrics: bool) -> utoipa::openapi::OpenApi {
    routes(with_metrics).into_openapi()
}

/// The whole API, with `limits` applied to every route; `/metrics` too
/// unless `with_metrics` is false (it is then served by [`metrics_router`]
/// on its own address).
pub fn router(state: AppState, limits: RequestLimits, with_metrics: bool) -> Router {
    let (routes, doc) = routes(with_metrics).split_for_parts();
    let routes = routes.layer(Extension(openapi::Served::new(&doc)));
    let track = middleware::from_fn_with_state(state.metrics.clone(), metrics::track);
    let api = routes
        .route_layer(middleware::from_fn_with_state(limits, limits::deadline))
        .route_layer(middleware::from_fn_with_state(
            limits,
            limits::body_idle_timeout,
        ))
        // Last, so it wraps every route above and counts their timeouts.
        .route_layer(track.clone())
        .route_layer(middleware::from_fn(answer::record))
        .route_layer(middleware::from_fn(challenge::bearer))
        // The OCI pull API: the distribution spec's routes and answers,
        // outside the OpenAPI document and the `/v1` conventions.
        .merge(registry::router().route_layer(track.clone()))
        // Unknown paths answer like Go's mux, counted under one `unmatched`
        // route label.
        .fallback(mux::not_found.layer(track))
        .with_state(state);
    // Go's `ServeMux` answers around the whole router (redirects before
    // routing; the router's finished 405s with their `Allow`).
    request_id::layer(
        Router::new()
            .fallback_service(api)
            .layer(middleware::from_fn(mux::go_mux)),
    )
}

/// `/metrics` alone, for its own listen address (`--metrics-addr`).
pub fn metrics_router(metrics: Metrics) -> Router {
    let track = middleware::from_fn_with_state(metrics.clone(), metrics::track);
    let routes = Router::new()
        .route("/metrics", get(metrics::render))
        .route_layer(track.clone())
        .fallback(mux::not_found.layer(track))
        .with_state(metrics);
    request_id::layer(
        Router::new()
            .fallback_service(routes)
            .layer(middleware::from_fn(mux::go_mux)),
    )
}
