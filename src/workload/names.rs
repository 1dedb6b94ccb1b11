//! Validation of workload names, context types and revisions.

use rand::RngCore;

/// Longest workload name.
pub const MAX_NAME_LEN: usize = 50;

/// Context types a workload may declare.
pub const CONTEXT_TYPES: [&str; 5] = ["workspace", "state", "memory", "knowledge", "artifacts"];

/// The default context type.
pub const DEFAULT_CONTEXT_TYPE: &str = "workspace";

/// Whether `name` is a lowercase DNS label of at most [`MAX_NAME_LEN`]
/// characters: `[a-z0-9]`, inner `-`, alphanumeric at both ends.
pub fn is_valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && b.iter().all(|c| alnum(c) || *c == b'-')
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
}

/// A fresh default name: `wl-` and 8 random hex digits.
pub fn default_name() -> String {
    let mut bytes = [0u8; 4];
    rand::rng().fill_bytes(&mut bytes);
    format!("wl-{}", hex::encode(bytes))
}

/// Whether `revision` is exactly 64 lowercase hex digits.
pub fn is_valid_revision(revision: &str) -> bool {
    crate::store::is_digest(revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "wl-0a1b2c3d", "x-y-z", "0", &"a".repeat(50)] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "a/b",
            "é",
            &"a".repeat(51),
        ] {
            assert!(!is_valid_name(bad), "{bad}");
        }
        let d = default_name();
        assert!(is_valid_name(&d) && d.len() == 11 && d.starts_with("wl-"));
        assert_ne!(default_name(), default_name());
    }

    #[test]
    fn revisions() {
        assert!(is_valid_revision(&"0f".repeat(32)));
        assert!(!is_valid_revision(&"0F".repeat(32)));
        assert!(!is_valid_revision(&"0".repeat(63)));
        assert!(!is_valid_revision(&"g".repeat(64)));
    }
}
