//! Path rules for archive members and the canonical path order.

use std::cmp::Ordering;

use super::error::BundleError;
use super::limits::Limits;

/// Longest path component Linux can create (`NAME_MAX`); a longer one
/// would be accepted here and then fail to extract in every sandbox.
const NAME_MAX: usize = 255;

/// Longest name shown in an error message; hostile names can be 4 KiB+.
const SHOWN_NAME_BYTES: usize = 256;

/// A member name decoded lossily and shortened, for error messages only.
pub(crate) fn display_name(raw: &[u8]) -> String {
    let shown = &raw[..raw.len().min(SHOWN_NAME_BYTES)];
    let mut s = String::from_utf8_lossy(shown).into_owned();
    if raw.len() > SHOWN_NAME_BYTES {
        s.push('…');
    }
    s
}

/// A validated, normalised relative path: UTF-8, `/`-separated, no empty,
/// `.` or `..` components, no leading or trailing slash.
///
/// Ordered component by component (byte-wise within a component), which
/// is byte order with `/` sorting before every other byte. A directory
/// therefore always sorts right before its own contents, and the order is
/// what `tar --sort=name` and a sorted directory walk produce.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CanonPath(String);

impl CanonPath {
    /// The path as text.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// Builds a path from components already checked by the caller.
    pub(crate) fn from_trusted(s: String) -> Self {
        CanonPath(s)
    }

    /// Every proper ancestor, outermost first (`a`, `a/b` for `a/b/c`).
    pub(crate) fn ancestors(&self) -> impl Iterator<Item = &str> {
        self.0
            .char_indices()
            .filter(|&(_, c)| c == '/')
            .map(|(i, _)| &self.0[..i])
    }
}

impl Ord for CanonPath {
    fn cmp(&self, other: &Self) -> Ordering {
        canonical_cmp(&self.0, &other.0)
    }
}

/// The canonical order of two normalised paths (see [`CanonPath`]), for
/// callers that hold one as text.
pub(crate) fn canonical_cmp(a: &str, b: &str) -> Ordering {
    // NUL never appears in a valid path, so mapping '/' to 0 makes plain
    // byte comparison equal to component-wise comparison. Only the first
    // differing byte needs the mapping: the common prefix (found at memcmp
    // speed) compares equal either way.
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let common = common_prefix(a, b);
    let key = |b: u8| if b == b'/' { 0 } else { b };
    match (a.get(common), b.get(common)) {
        (Some(&x), Some(&y)) => key(x).cmp(&key(y)),
        _ => a.len().cmp(&b.len()),
    }
}

/// Length of the longest common prefix of `a` and `b`, eight bytes at a time.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let (x, y) = (&a[i..i + 8], &b[i..i + 8]);
        if x != y {
            break;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

impl PartialOrd for CanonPath {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Checks a member name against every path rule and normalises it.
///
/// Returns `Ok(None)` for a name that denotes the archive root (`.`, `./`),
/// which `tar -C dir .` writes first; callers ignore it for directories and
/// reject it for files.
pub(crate) fn normalize(raw: &[u8], limits: &Limits) -> Result<Option<CanonPath>, BundleError> {
    let entry = || display_name(raw);
    if raw.len() > limits.path_bytes {
        return Err(BundleError::PathTooLong {
            entry: entry(),
            len: raw.len(),
            limit: limits.path_bytes,
        });
    }
    if raw.is_empty() {
        return Err(BundleError::EmptyPath { entry: entry() });
    }
    if raw.contains(&0) {
        return Err(BundleError::NulInPath { entry: entry() });
    }
    let text = std::str::from_utf8(raw).map_err(|_| BundleError::NonUtf8Path { entry: entry() })?;
    if text.starts_with('/') {
        return Err(BundleError::AbsolutePath { entry: entry() });
    }
    if text.contains('\\') {
        return Err(BundleError::Backslash { entry: entry() });
    }
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for component in text.split('/') {
        match component {
            "" | "." => continue,
            ".." => return Err(BundleError::PathTraversal { entry: entry() }),
            c if c.len() > NAME_MAX => {
                return Err(BundleError::NameTooLong {
                    entry: entry(),
                    len: c.len(),
                    limit: NAME_MAX,
                })
            }
            c => {
                depth += 1;
                if depth > limits.depth {
                    return Err(BundleError::PathTooDeep {
                        entry: entry(),
                        depth: text
                            .split('/')
                            .filter(|c| !c.is_empty() && *c != ".")
                            .count(),
                        limit: limits.depth,
                    });
                }
                if !out.is_empty() {
                    out.push('/');
                }
                out.push_str(c);
            }
        }
    }
    Ok((!out.is_empty()).then_some(CanonPath(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> Result<Option<String>, &'static str> {
        normalize(s.as_bytes(), &Limits::default())
            .map(|p| p.map(|p| p.0))
            .map_err(|e| e.code())
    }

    #[test]
    fn normalises_dot_slash_and_trailing_slash() {
        assert_eq!(norm("./a/b/"), Ok(Some("a/b".into())));
        assert_eq!(norm("a//./b"), Ok(Some("a/b".into())));
        assert_eq!(norm("./"), Ok(None));
        assert_eq!(norm("a/../b"), Err("path_traversal"));
        assert_eq!(norm("/etc"), Err("absolute_path"));
        assert_eq!(norm("a\\b"), Err("backslash_in_path"));
        assert_eq!(norm(""), Err("empty_path"));
    }

    #[test]
    fn order_is_component_wise() {
        let mut v: Vec<CanonPath> = ["a-b", "a/b", "a", "a.b", "b", "a/b/c"]
            .iter()
            .map(|s| CanonPath(s.to_string()))
            .collect();
        v.sort();
        let got: Vec<&str> = v.iter().map(super::CanonPath::as_str).collect();
        assert_eq!(got, ["a", "a/b", "a/b/c", "a-b", "a.b", "b"]);
        // Past the first 8 bytes (the common prefix is found a word at a
        // time) the mapping still decides.
        let mut v: Vec<CanonPath> = ["abcdefghij/k", "ab", "a.b/x", "abcdefghi/k"]
            .into_iter()
            .map(|s| CanonPath(s.into()))
            .collect();
        v.sort();
        let got: Vec<&str> = v.iter().map(CanonPath::as_str).collect();
        assert_eq!(got, ["a.b/x", "ab", "abcdefghi/k", "abcdefghij/k"]);
        let (x, y) = (
            CanonPath("abcdefgh/ij".into()),
            CanonPath("abcdefgh/ij".into()),
        );
        assert_eq!(x.cmp(&y), Ordering::Equal);
    }

    #[test]
    fn ancestors_outermost_first() {
        let p = CanonPath("a/b/c".into());
        assert_eq!(p.ancestors().collect::<Vec<_>>(), ["a", "a/b"]);
    }
}
