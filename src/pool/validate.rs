//! Request validation, in upstream's exact order and with its exact messages.
//!
//! The first failing rule decides the `400 invalid_request` message.

use std::time::Duration;

use super::model::{AccessMode, ContextVolumeSpec, ContextVolumeType, PoolSpec, Strategy};
use super::quantity;

/// Longest pool or context name: keeps `<name>-workspace-99` within 63.
pub const MAX_NAME_LEN: usize = 50;
/// Most sandboxes one pool may have.
pub const MAX_REPLICAS: i64 = 100;

/// A create-pool request as decoded from JSON, before validation. Absent
/// fields hold their zero value, as upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreatePoolRequest {
    /// `name`.
    pub name: String,
    /// `replicas` (any integer; validated to 1..=100).
    pub replicas: i64,
    /// `warmPoolRef` (`""` = absent).
    pub warm_pool_ref: String,
    /// `workspace`.
    pub workspace: WorkspaceRequest,
    /// `ttl`, e.g. `2h` (`""` = absent: the pool never expires). Checked
    /// by [`ttl`] against the service's bounds.
    pub ttl: String,
}

/// The `workspace` object of a create-pool request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkspaceRequest {
    /// `size`.
    pub size: String,
    /// `accessMode`.
    pub access_mode: String,
    /// `storageClass`.
    pub storage_class: String,
    /// `claimName`.
    pub claim_name: String,
    /// `readOnly`: `None` when absent or `null`.
    pub read_only: Option<bool>,
}

/// A create-context request as decoded from JSON, before validation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateContextVolumeRequest {
    /// `name`.
    pub name: String,
    /// `namespace`.
    pub namespace: String,
    /// `type`.
    pub context_type: String,
    /// `storage`.
    pub storage: StorageRequest,
}

/// The `storage` object of a create-context request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageRequest {
    /// `backend` (must be `pvc`).
    pub backend: String,
    /// `size`.
    pub size: String,
    /// `accessMode`.
    pub access_mode: String,
    /// `storageClass`.
    pub storage_class: String,
}

/// A rule a request broke; the message is upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub &'static str);

/// Message for a bad pool or context name.
pub const NAME_MESSAGE: &str =
    "name must be a lowercase Kubernetes name no longer than 50 characters";

/// Validates a create-pool request into a spec for `owner_scope`.
pub fn pool(req: &CreatePoolRequest, owner_scope: &str) -> Result<PoolSpec, Invalid> {
    if !is_pool_name(&req.name) {
        return Err(Invalid(NAME_MESSAGE));
    }
    if !(1..=MAX_REPLICAS).contains(&req.replicas) {
        return Err(Invalid("replicas must be between 1 and 100"));
    }
    // Checked above: 1..=100 fits.
    let replicas =
        u32::try_from(req.replicas).map_err(|_| Invalid("replicas must be between 1 and 100"))?;
    let ws = &req.workspace;
    let strategy = if !req.warm_pool_ref.is_empty() {
        if !is_dns1123_subdomain(&req.warm_pool_ref) {
            return Err(Invalid("warmPoolRef must be a lowercase Kubernetes name"));
        }
        // `readOnly:false` counts as a setting, as upstream.
        if !ws.size.is_empty()
            || !ws.access_mode.is_empty()
            || !ws.storage_class.is_empty()
            || !ws.claim_name.is_empty()
            || ws.read_only.is_some()
        {
            return Err(Invalid(
                "warmPoolRef cannot be combined with workspace settings",
            ));
        }
        Strategy::Warm {
            pool: req.warm_pool_ref.clone(),
        }
    } else if !ws.claim_name.is_empty() {
        if !is_dns1123_subdomain(&ws.claim_name) {
            return Err(Invalid(
                "workspace.claimName must be a lowercase Kubernetes name",
            ));
        }
        if !ws.size.is_empty() || !ws.access_mode.is_empty() || !ws.storage_class.is_empty() {
            return Err(Invalid(
                "workspace.claimName cannot be combined with size, accessMode, or storageClass",
            ));
        }
        let Some(read_only) = ws.read_only else {
            return Err(Invalid(
                "workspace.readOnly is required with workspace.claimName",
            ));
        };
        Strategy::Existing {
            claim_name: ws.claim_name.clone(),
            read_only,
        }
    } else {
        if ws.read_only.is_some() {
            return Err(Invalid("workspace.readOnly requires workspace.claimName"));
        }
        if ws.size.trim().is_empty() {
            return Err(Invalid("workspace.size is required"));
        }
        // Upstream parses the untrimmed size, so " 1Gi" fails here.
        if !quantity::is_positive(&ws.size) {
            return Err(Invalid(
                "workspace.size must be a positive Kubernetes quantity",
            ));
        }
        let storage_class = (!ws.storage_class.is_empty()).then(|| ws.storage_class.clone());
        let size = ws.size.clone();
        match AccessMode::parse(&ws.access_mode) {
            Some(AccessMode::ReadWriteMany) => Strategy::Shared {
                size,
                storage_class,
            },
            Some(AccessMode::ReadWriteOnce) => Strategy::Dedicated {
                size,
                storage_class,
            },
            None => {
                return Err(Invalid(
                    "workspace.accessMode must be ReadWriteMany or ReadWriteOnce",
                ))
            }
        }
    };
    Ok(PoolSpec {
        name: req.name.clone(),
        replicas,
        strategy,
        owner_scope: owner_scope.to_owned(),
        expires_at: None,
    })
}

/// The shortest and longest `ttl` a pool may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtlBounds {
    /// Shortest accepted `ttl`.
    pub min: Duration,
    /// Longest accepted `ttl`.
    pub max: Duration,
}

impl TtlBounds {
    /// `min..=max`, refused unless `0 < min <= max` (the message names the
    /// settings).
    pub fn new(min: Duration, max: Duration) -> Result<Self, InvalidTtl> {
        if min.is_zero() || min > max {
            return Err(InvalidTtl(format!(
                "--pool-ttl-min ({}) must be positive and at most --pool-ttl-max ({})",
                humantime::format_duration(min),
                humantime::format_duration(max)
            )));
        }
        Ok(Self { min, max })
    }
}

impl Default for TtlBounds {
    /// 1 minute to 7 days.
    fn default() -> Self {
        Self {
            min: Duration::from_secs(60),
            max: Duration::from_secs(168 * 3600),
        }
    }
}

/// Why a `ttl` was refused: the message is shown as is (`400`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidTtl(pub String);

/// The pool's lifetime from a request's `ttl` (humantime, e.g. `2h`,
/// `90m`, `1h 30m`): `None` when absent, else within `bounds`.
pub fn ttl(raw: &str, bounds: TtlBounds) -> Result<Option<Duration>, InvalidTtl> {
    if raw.is_empty() {
        return Ok(None);
    }
    let (min, max) = (short_duration(bounds.min), short_duration(bounds.max));
    let parsed = humantime::parse_duration(raw.trim()).map_err(|_| {
        InvalidTtl(format!(
            "ttl must be a duration such as 2h or 30m (between {min} and {max})"
        ))
    })?;
    if parsed < bounds.min || parsed > bounds.max {
        return Err(InvalidTtl(format!(
            "ttl must be between {min} and {max}; got {raw}"
        )));
    }
    Ok(Some(parsed))
}

/// `168h`, `1m`, `90s`, `250ms`: the largest of h, m, s, ms that divides
/// the duration (humantime would say `7days`, which `2h` users misread).
pub fn short_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1000)] {
        if ms >= size && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Validates a create-context request into a spec for `owner_scope`.
pub fn context(
    req: &CreateContextVolumeRequest,
    owner_scope: &str,
) -> Result<ContextVolumeSpec, Invalid> {
    if !is_pool_name(&req.name) {
        return Err(Invalid(NAME_MESSAGE));
    }
    if !is_dns1123_label(&req.namespace) {
        return Err(Invalid("namespace must be a lowercase Kubernetes name"));
    }
    let Some(context_type) = ContextVolumeType::parse(&req.context_type) else {
        return Err(Invalid(
            "type must be workspace, memory, knowledge, or artifacts",
        ));
    };
    let st = &req.storage;
    if st.backend != "pvc" {
        return Err(Invalid("storage.backend must be pvc"));
    }
    if !quantity::is_positive(&st.size) {
        return Err(Invalid(
            "storage.size must be a positive Kubernetes quantity",
        ));
    }
    // Note the word order differs from the pool message, as upstream.
    let Some(access_mode) = AccessMode::parse(&st.access_mode) else {
        return Err(Invalid(
            "storage.accessMode must be ReadWriteOnce or ReadWriteMany",
        ));
    };
    Ok(ContextVolumeSpec {
        name: req.name.clone(),
        namespace: req.namespace.clone(),
        context_type,
        size: st.size.clone(),
        access_mode,
        storage_class: (!st.storage_class.is_empty()).then(|| st.storage_class.clone()),
        owner_scope: owner_scope.to_owned(),
    })
}

/// A pool or context name: a DNS-1123 label of at most 50 characters.
pub fn is_pool_name(s: &str) -> bool {
    s.len() <= MAX_NAME_LEN && is_label_chars(s)
}

/// A DNS-1123 label: 1..=63 characters of `[a-z0-9-]`, alphanumeric at
/// both ends.
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label_chars(s)
}

/// A DNS-1123 subdomain: at most 253 characters, dot-separated labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label_chars)
}

fn is_label_chars(s: &str) -> bool {
    let bytes = s.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|&b| alnum(b) || b == b'-')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn managed(size: &str, mode: &str) -> CreatePoolRequest {
        CreatePoolRequest {
            name: "demo".into(),
            replicas: 1,
            workspace: WorkspaceRequest {
                size: size.into(),
                access_mode: mode.into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn names() {
        assert!(is_pool_name("a"));
        assert!(is_pool_name("a-1"));
        assert!(is_pool_name(&"a".repeat(50)));
        assert!(!is_pool_name(&"a".repeat(51)));
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "a\n", "é"] {
            assert!(!is_pool_name(bad), "{bad:?}");
        }
        assert!(is_dns1123_subdomain("a.b-c.d"));
        for bad in ["", "a..b", ".a", "a.", "a.-b", "A.b"] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(is_dns1123_label(&"a".repeat(63)));
        assert!(!is_dns1123_label(&"a".repeat(64)));
    }

    #[test]
    fn managed_strategies() {
        let spec = pool(&managed("5Gi", "ReadWriteMany"), "o").unwrap();
        assert_eq!(
            spec.strategy,
            Strategy::Shared {
                size: "5Gi".into(),
                storage_class: None
            }
        );
        assert_eq!(spec.owner_scope, "o");
        let mut req = managed("1Gi", "ReadWriteOnce");
        req.workspace.storage_class = "fast".into();
        assert_eq!(
            pool(&req, "o").unwrap().strategy,
            Strategy::Dedicated {
                size: "1Gi".into(),
                storage_class: Some("fast".into())
            }
        );
    }

    #[test]
    fn ttls() {
        let bounds = TtlBounds::default();
        assert_eq!(ttl("", bounds), Ok(None));
        assert_eq!(ttl("2h", bounds), Ok(Some(Duration::from_secs(7200))));
        assert_eq!(ttl("1h 30m", bounds), Ok(Some(Duration::from_secs(5400))));
        assert_eq!(
            ttl("168h", bounds),
            Ok(Some(Duration::from_secs(168 * 3600)))
        );
        assert_eq!(
            ttl("59s", bounds).unwrap_err().0,
            "ttl must be between 1m and 168h; got 59s"
        );
        assert_eq!(
            ttl("169h", bounds).unwrap_err().0,
            "ttl must be between 1m and 168h; got 169h"
        );
        assert_eq!(
            ttl("soon", bounds).unwrap_err().0,
            "ttl must be a duration such as 2h or 30m (between 1m and 168h)"
        );
        assert!(ttl("-1h", bounds).is_err());
        assert_eq!(short_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(short_duration(Duration::from_secs(90)), "90s");
    }

    proptest::proptest! {
        #[test]
        fn every_label_shaped_name_up_to_50_is_accepted(
            name in "[a-z0-9]([-a-z0-9]{0,48}[a-z0-9])?"
        ) {
            proptest::prop_assert!(is_pool_name(&name));
            proptest::prop_assert!(is_dns1123_subdomain(&name));
        }

        #[test]
        fn names_with_other_characters_are_rejected(
            head in "[a-z0-9]{0,10}",
            bad in "[^a-z0-9-]",
            tail in "[a-z0-9]{0,10}",
        ) {
            let name = format!("{head}{bad}{tail}");
            proptest::prop_assert!(!is_pool_name(&name));
        }

        #[test]
        fn valid_requests_always_give_a_spec(
            replicas in 1i64..=100,
            shared in proptest::bool::ANY,
            size in "[1-9][0-9]{0,3}(Ki|Mi|Gi|Ti|m|k|M|G)?",
        ) {
            let mode = if shared { "ReadWriteMany" } else { "ReadWriteOnce" };
            let mut req = managed(&size, mode);
            req.replicas = replicas;
            let spec = pool(&req, "o").unwrap();
            proptest::prop_assert_eq!(i64::from(spec.replicas), replicas);
            proptest::prop_assert_eq!(spec.strategy.kind(), if shared { "shared" } else { "dedicated" });
        }
    }
}
