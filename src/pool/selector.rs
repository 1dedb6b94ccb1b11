//! Equality-based label selectors (`k=v,k!=v,k,!k`), as `kubectl -l` takes
//! them, parsed once from the settings and matched against the labels a
//! backend records for its sandboxes.
//!
//! Set-based forms (`k in (a,b)`) are not supported; an empty selector is
//! refused, because it would select every sandbox.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` (or `key==value`).
    Equals(String, String),
    /// `key!=value`: the label is absent or has another value.
    NotEquals(String, String),
    /// `key`: the label exists.
    Exists(String),
    /// `!key`: the label does not exist.
    NotExists(String),
}

/// A parsed, non-empty label selector: every requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// Why a selector does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {reason}")]
pub struct SelectorError {
    /// The selector as given.
    pub selector: String,
    /// What is wrong with it.
    pub reason: String,
}

impl LabelSelector {
    /// The requirements, in the order given.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| SelectorError {
            selector: s.to_owned(),
            reason,
        };
        let mut requirements = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(err("empty requirement".into()));
            }
            let requirement = if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::NotExists(k.trim().to_owned())
            } else {
                Requirement::Exists(part.to_owned())
            };
            let (key, value) = match &requirement {
                Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => (k, Some(v)),
                Requirement::Exists(k) | Requirement::NotExists(k) => (k, None),
            };
            if !is_label_key(key) {
                return Err(err(format!("{key:?} is not a label key")));
            }
            if let Some(v) = value {
                if !is_label_value(v) {
                    return Err(err(format!("{v:?} is not a label value")));
                }
            }
            requirements.push(requirement);
        }
        Ok(Self { requirements })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::Equals(k, v) => write!(f, "{k}={v}")?,
                Requirement::NotEquals(k, v) => write!(f, "{k}!={v}")?,
                Requirement::Exists(k) => write!(f, "{k}")?,
                Requirement::NotExists(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

/// A label name: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// `[prefix/]name`, the prefix a DNS subdomain.
fn is_label_key(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => {
            super::validate::is_dns1123_subdomain(prefix) && is_label_name(name)
        }
        None => is_label_name(s),
    }
}

/// Empty, or a label name.
fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_label_name(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn parses_and_matches_every_form() {
        let s: LabelSelector = "context.rossoctl.io/pool=shared, tier!=gpu,team,!legacy"
            .parse()
            .unwrap();
        assert_eq!(
            s.to_string(),
            "context.rossoctl.io/pool=shared,tier!=gpu,team,!legacy"
        );
        let ok = labels(&[("context.rossoctl.io/pool", "shared"), ("team", "a")]);
        assert!(s.matches(&ok));
        let mut gpu = ok.clone();
        gpu.insert("tier".into(), "gpu".into());
        assert!(!s.matches(&gpu));
        let mut legacy = ok.clone();
        legacy.insert("legacy".into(), String::new());
        assert!(!s.matches(&legacy));
        assert!(!s.matches(&labels(&[("context.rossoctl.io/pool", "shared")])));
        let eq: LabelSelector = "a==b".parse().unwrap();
        assert_eq!(
            eq.requirements(),
            &[Requirement::Equals("a".into(), "b".into())]
        );
    }

    #[test]
    fn refuses_what_kubernetes_refuses() {
        for bad in [
            "", "a,", "a=b,,c", "-a=b", "a=b c", "a in (b)", "Bad_/x=y", "a=$(x)",
        ] {
            assert!(bad.parse::<LabelSelector>().is_err(), "{bad}");
        }
    }
}
