//! The `deliver` arguments: `key=value` words, every key exactly once,
//! every value checked by the rule the gateway's renderer applies.

use crate::fail::Fail;
use crate::rules::{
    is_lower_hex, is_valid_root, is_valid_run_id, is_valid_scope, is_valid_workload,
};

/// Largest size or count accepted (the script's shell-arithmetic bound).
const MAX_INT: u64 = 1 << 62;

/// How a cache hit is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// Paths, kinds, modes and sizes.
    Default,
    /// Also every file's sha256.
    Full,
}

/// One delivery, as the gateway described it.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// The delivery root: absolute (the launcher resolves a relative one).
    pub(crate) root: String,
    pub(crate) scope: String,
    pub(crate) workload: String,
    pub(crate) run: String,
    /// sha256 of the canonical tar.
    pub(crate) revision: String,
    /// sha256 of the gzip bundle.
    pub(crate) digest: String,
    /// Bundle bytes to read on a miss.
    pub(crate) size: u64,
    /// Bytes the bundle inflates to.
    pub(crate) inflated: u64,
    /// Files and directories of the tree.
    pub(crate) entries: u64,
    pub(crate) verify: Verify,
    /// The tree manifest's three digests.
    pub(crate) names: String,
    pub(crate) modes: String,
    pub(crate) content: String,
}

const KEYS: &[&str] = &[
    "root", "scope", "workload", "run", "revision", "digest", "size", "inflated", "entries",
    "verify", "names", "modes", "content",
];

fn bad(what: &str) -> Fail {
    Fail::new(
        "bad_request",
        format!("the agent's argument {what} is invalid"),
    )
}

/// Parses and checks the `deliver` arguments.
pub(crate) fn parse(words: &[String]) -> Result<Request, Fail> {
    let mut values: Vec<Option<&str>> = vec![None; KEYS.len()];
    for w in words {
        let (k, v) = w.split_once('=').ok_or_else(|| bad("list"))?;
        let i = KEYS
            .iter()
            .position(|key| *key == k)
            .ok_or_else(|| bad(k))?;
        if values[i].replace(v).is_some() {
            return Err(bad(k));
        }
    }
    let get = |k: &'static str| -> Result<&str, Fail> {
        let i = KEYS
            .iter()
            .position(|key| *key == k)
            .ok_or_else(|| bad(k))?;
        values[i].ok_or_else(|| bad(k))
    };
    let hex64 = |k: &'static str| -> Result<String, Fail> {
        let v = get(k)?;
        is_lower_hex(v, 64)
            .then(|| v.to_owned())
            .ok_or_else(|| bad(k))
    };
    let int = |k: &'static str, min: u64| -> Result<u64, Fail> {
        let v = get(k)?;
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(k));
        }
        v.parse::<u64>()
            .ok()
            .filter(|n| (min..=MAX_INT).contains(n))
            .ok_or_else(|| bad(k))
    };
    let root = get("root")?;
    if !root.starts_with('/') || !is_valid_root(root) {
        return Err(bad("root"));
    }
    let checked = |k: &'static str, rule: fn(&str) -> bool| -> Result<String, Fail> {
        let v = get(k)?;
        rule(v).then(|| v.to_owned()).ok_or_else(|| bad(k))
    };
    let verify = match get("verify")? {
        "default" => Verify::Default,
        "full" => Verify::Full,
        _ => return Err(bad("verify")),
    };
    Ok(Request {
        root: root.to_owned(),
        scope: checked("scope", is_valid_scope)?,
        workload: checked("workload", is_valid_workload)?,
        run: checked("run", is_valid_run_id)?,
        revision: hex64("revision")?,
        digest: hex64("digest")?,
        size: int("size", 1)?,
        inflated: int("inflated", 1)?,
        entries: int("entries", 0)?,
        verify,
        names: hex64("names")?,
        modes: hex64("modes")?,
        content: hex64("content")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(extra: &[(&str, &str)]) -> Vec<String> {
        let h = "a".repeat(64);
        let mut base: Vec<(String, String)> = [
            ("root", "/r"),
            ("scope", "0123456789abcdef0123456789abcdef"),
            ("workload", "wl"),
            ("run", "r1"),
            ("size", "10"),
            ("inflated", "20"),
            ("entries", "2"),
            ("verify", "default"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for k in ["revision", "digest", "names", "modes", "content"] {
            base.push((k.into(), h.clone()));
        }
        for (k, v) in extra {
            base.retain(|(bk, _)| bk != k);
            base.push((k.to_string(), v.to_string()));
        }
        base.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    #[test]
    fn accepts_the_rendered_values_and_refuses_hostile_ones() {
        assert!(parse(&words(&[])).is_ok());
        for (k, v) in [
            ("root", "relative"),
            ("root", "/a/../b"),
            ("run", "A"),
            ("workload", "a_b"),
            ("scope", "xyz"),
            ("revision", "AA"),
            ("size", "0"),
            ("size", "+1"),
            ("verify", "fast"),
        ] {
            assert_eq!(
                parse(&words(&[(k, v)])).unwrap_err().code,
                "bad_request",
                "{k}={v}"
            );
        }
        let mut twice = words(&[]);
        twice.push("run=r2".into());
        assert!(parse(&twice).is_err());
        let mut unknown = words(&[]);
        unknown.push("x=1".into());
        assert!(parse(&unknown).is_err());
    }
}
