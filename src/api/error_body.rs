//! The JSON shape of every error answer, shared by the server and the
//! client. Plain serde: the client uses it without the server's HTTP stack.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// Stable snake_case error code, e.g. `workload_not_found`.
    pub error: String,
    /// Human-readable explanation; never raw backend text.
    pub message: String,
}
