//! clap value parsers for `contextctl` flags: a bad value is a usage error
//! (exit 2) that names the flag and says the rule in words, e.g.
//! `invalid value '10Qi' for '--size <SIZE>': must be a positive Kubernetes
//! quantity such as 512Mi or 5Gi`. Each parser applies the service's own
//! check, so what passes here is what the service accepts.

use std::time::Duration;

use crate::delivery::RunId;
use crate::pool::{quantity, validate};
use crate::workload::names;

/// The rule of a run id (`--run`), in words; the service's pattern is
/// `^[a-z0-9][a-z0-9._-]{0,62}$`.
pub const RUN_ID_RULE: &str = "a run id is 1 to 63 lowercase letters, digits, '.', '_' or '-', \
     starting with a letter or digit";

/// The rule of a size (`--size`), in words.
pub const SIZE_RULE: &str = "must be a positive Kubernetes quantity such as 512Mi, 5Gi or 1T";

/// `--run`: a run id the service accepts ([`crate::delivery::RunId`]).
pub fn run_id(text: &str) -> Result<RunId, String> {
    RunId::try_from(text).map_err(|_| RUN_ID_RULE.to_owned())
}

/// `--size`: a positive Kubernetes quantity, as the service checks it.
pub fn size(text: &str) -> Result<String, String> {
    if quantity::is_positive(text) {
        Ok(text.to_owned())
    } else {
        Err(SIZE_RULE.to_owned())
    }
}

/// `-n/--replicas`: the number of sandboxes, 1 to
/// [`validate::MAX_REPLICAS`].
pub fn replicas(text: &str) -> Result<i64, String> {
    let rule = || {
        format!(
            "the number of sandboxes must be a whole number from 1 to {}",
            validate::MAX_REPLICAS
        )
    };
    match text.trim().parse::<i64>() {
        Ok(n) if (1..=validate::MAX_REPLICAS).contains(&n) => Ok(n),
        _ => Err(rule()),
    }
}

/// `--ttl` of a pool: a duration longer than zero, passed on as written
/// (the service checks its configured bounds, 1m to 168h by default).
pub fn pool_ttl(text: &str) -> Result<String, String> {
    match humantime::parse_duration(text.trim()) {
        Ok(d) if d > Duration::ZERO => Ok(text.to_owned()),
        Ok(_) => Err("a pool must live longer than 0s".to_owned()),
        Err(_) => Err("must be a duration such as 2h, 30m or 1h 30m".to_owned()),
    }
}

/// A pool or context name: a lowercase Kubernetes name of at most
/// [`validate::MAX_NAME_LEN`] characters.
pub fn pool_name(text: &str) -> Result<String, String> {
    if validate::is_pool_name(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "a name is at most {} lowercase letters, digits and '-', starting and ending \
             with a letter or digit",
            validate::MAX_NAME_LEN
        ))
    }
}

/// `--namespace`: a Kubernetes namespace name (a DNS-1123 label).
pub fn namespace(text: &str) -> Result<String, String> {
    if validate::is_dns1123_label(text) {
        Ok(text.to_owned())
    } else {
        Err(
            "a namespace is at most 63 lowercase letters, digits and '-', starting and \
             ending with a letter or digit"
                .to_owned(),
        )
    }
}

/// `--claim` and `--warm-pool`: the name of a Kubernetes object (a
/// DNS-1123 subdomain).
pub fn object_name(text: &str) -> Result<String, String> {
    if validate::is_dns1123_subdomain(text) {
        Ok(text.to_owned())
    } else {
        Err(
            "must be a lowercase Kubernetes name: lowercase letters, digits, '-' and '.', \
             at most 253"
                .to_owned(),
        )
    }
}

/// A workload name (`workload create NAME`), as the service checks it.
pub fn workload_name(text: &str) -> Result<String, String> {
    if names::is_valid_name(text) {
        Ok(text.to_owned())
    } else {
        Err(crate::delivery::WORKLOAD_NAME_RULE.to_owned())
    }
}

/// A revision (`workload activate|download`): 64 lowercase hex digits.
pub fn revision(text: &str) -> Result<String, String> {
    if names::is_valid_revision(text) {
        Ok(text.to_owned())
    } else {
        Err("a revision is 64 lowercase hex digits (as `workload upload` prints it)".to_owned())
    }
}

/// `token mint --sub`: a subject that is not blank.
pub fn subject(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("the subject must not be empty".to_owned())
    } else {
        Ok(text.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_follow_the_service() {
        for ok in ["r2", "0", "a.b_c-d", &"a".repeat(63)] {
            assert_eq!(run_id(ok).map(|r| r.to_string()), Ok(ok.to_owned()));
        }
        for bad in ["", "R2", "-a", ".a", "a b", &"a".repeat(64)] {
            assert_eq!(
                run_id(bad).map(|_| ()),
                Err(RUN_ID_RULE.to_owned()),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn sizes_replicas_and_ttls() {
        assert_eq!(size("5Gi"), Ok("5Gi".to_owned()));
        for bad in ["10Qi", "0", "-1Gi", "", " 1Gi"] {
            assert_eq!(size(bad), Err(SIZE_RULE.to_owned()), "{bad:?}");
        }
        assert_eq!(replicas("1"), Ok(1));
        assert_eq!(replicas("100"), Ok(100));
        for bad in ["0", "101", "-1", "three", "1.5"] {
            assert!(replicas(bad).is_err(), "{bad:?}");
        }
        assert_eq!(pool_ttl("1h 30m"), Ok("1h 30m".to_owned()));
        assert!(pool_ttl("0s").is_err());
        assert!(pool_ttl("soon").is_err());
    }

    #[test]
    fn names_revisions_and_subjects() {
        assert!(pool_name("team-1").is_ok());
        assert!(pool_name(&"a".repeat(51)).is_err());
        assert!(namespace("team-a").is_ok());
        assert!(namespace("Team").is_err());
        assert!(object_name("context-docs.v1").is_ok());
        assert!(object_name("Docs").is_err());
        assert!(workload_name("docs").is_ok());
        assert!(workload_name("Docs").is_err());
        assert!(revision(&"0a".repeat(32)).is_ok());
        assert!(revision(&"0A".repeat(32)).is_err());
        assert!(subject(" ").is_err());
        assert!(subject("bob").is_ok());
    }
}
