//! Validation of workload names, context types and revisions, and the
//! types that hold only valid ones: a value is parsed once where it enters
//! (the API), and everything below takes the typed value instead of
//! checking the string again.

use rand::RngCore;

/// A string refused by a checked type's rule (a [`WorkloadName`], a
/// [`Revision`], a delivery run id): the string, handed back so the caller
/// can name it in its answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} breaks its rule")]
pub struct Invalid(pub String);

/// Defines a string newtype that can only hold values passing `$rule`
/// (`fn(&str) -> bool`): a private field, `TryFrom<String>`, `TryFrom<&str>`
/// and `FromStr` with the rule ([`Invalid`] otherwise), `Deref<Target =
/// str>`, `AsRef<str>`, `Display` (`Debug` shows it like the string), and serde as a plain string
/// (deserializing checks the rule too).
macro_rules! checked_string {
    ($(#[$meta:meta])* $vis:vis struct $name:ident: $rule:path;) => {
        $(#[$meta])*
        #[derive(
            Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
        )]
        #[serde(try_from = "String", into = "String")]
        $vis struct $name(String);

        impl $name {
            /// The value.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = $crate::workload::names::Invalid;

            fn try_from(value: String) -> Result<Self, Self::Error> {
                if $rule(&value) {
                    Ok(Self(value))
                } else {
                    Err($crate::workload::names::Invalid(value))
                }
            }
        }

        impl TryFrom<&str> for $name {
            type Error = $crate::workload::names::Invalid;

            fn try_from(value: &str) -> Result<Self, Self::Error> {
                Self::try_from(value.to_owned())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::workload::names::Invalid;

            fn from_str(value: &str) -> Result<Self, Self::Err> {
                Self::try_from(value)
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        // Shown like the string, so `{name:?}` in a message reads as before.
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&self.0, f)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }
    };
}
pub(crate) use checked_string;

checked_string! {
    /// A workload name: a lowercase DNS label of at most [`MAX_NAME_LEN`]
    /// characters (see [`is_valid_name`]).
    pub struct WorkloadName: is_valid_name;
}

checked_string! {
    /// A revision: exactly 64 lowercase hex digits (see
    /// [`is_valid_revision`]).
    pub struct Revision: is_valid_revision;
}

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

    #[test]
    fn checked_types_hold_only_valid_values() {
        let name: WorkloadName = "wl-1".parse().unwrap();
        assert_eq!(
            (name.as_str(), &*name, name.to_string()),
            ("wl-1", "wl-1", "wl-1".into())
        );
        assert_eq!(WorkloadName::try_from("A"), Err(Invalid("A".into())));
        assert!(Revision::try_from("0F".repeat(32)).is_err());
        // Serde: a plain string, checked on the way in.
        assert_eq!(serde_json::to_string(&name).unwrap(), r#""wl-1""#);
        assert_eq!(
            serde_json::from_str::<WorkloadName>(r#""wl-1""#).unwrap(),
            name
        );
        assert!(serde_json::from_str::<WorkloadName>(r#""a/b""#).is_err());
    }
}
