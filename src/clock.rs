//! The wall clock as the records store it: milliseconds since the epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the epoch (0 before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
