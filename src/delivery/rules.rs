//! The character rules of every value that reaches a sandbox, and of the
//! member names of a canonical bundle: pure functions with no dependency,
//! so the in-sandbox agent (`agent/`, which includes this file with
//! `#[path]`) checks exactly what the gateway checks, without linking the
//! service crate.

/// Longest accepted delivery root, in bytes.
pub const MAX_ROOT_BYTES: usize = 1024;

/// Longest path component Linux can create (`NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// Longest workload name.
pub const MAX_WORKLOAD_BYTES: usize = 50;

/// Whether `s` is exactly `len` lowercase hex digits.
pub fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `run_id` matches `^[a-z0-9][a-z0-9._-]{0,62}$`.
pub fn is_valid_run_id(run_id: &str) -> bool {
    let b = run_id.as_bytes();
    let first = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len())
        && b.first().is_some_and(first)
        && b.iter()
            .all(|c| first(c) || matches!(c, b'.' | b'_' | b'-'))
}

/// Whether `scope` is exactly 32 lowercase hex digits.
pub fn is_valid_scope(scope: &str) -> bool {
    is_lower_hex(scope, 32)
}

/// Whether `name` is a workload name: a lowercase DNS label of at most 50
/// characters (the same rule as `crate::workload::names::is_valid_name`,
/// which a unit test holds it to).
pub fn is_valid_workload(name: &str) -> bool {
    let b = name.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= MAX_WORKLOAD_BYTES
        && b.iter().all(|c| alnum(c) || *c == b'-')
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
}

/// Whether `root` is a usable delivery root: absolute, or relative to the
/// exec's working directory (no leading `/`); at most 1024 bytes, only
/// `[A-Za-z0-9._/-]`, and no empty, `.` or `..` component (so neither `/`
/// itself, `//` nor a trailing `/`).
pub fn is_valid_root(root: &str) -> bool {
    let rest = root.strip_prefix('/').unwrap_or(root);
    root.len() <= MAX_ROOT_BYTES
        && rest.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        })
}

/// Why `path` is not a member name a canonical bundle holds, or `None`
/// when it is one: a normalised relative path (`/`-separated, no leading
/// or trailing `/`, no empty, `.` or `..` component), UTF-8 (the caller
/// passes text), no NUL or backslash, components of at most [`NAME_MAX`]
/// bytes, at most `max_bytes` in all.
pub fn member_path_problem(path: &str, max_bytes: usize) -> Option<&'static str> {
    if path.is_empty() {
        return Some("an empty path");
    }
    if path.len() > max_bytes {
        return Some("a path that is too long");
    }
    if path.contains('\0') {
        return Some("a NUL in a path");
    }
    if path.contains('\\') {
        return Some("a backslash in a path");
    }
    if path.starts_with('/') {
        return Some("an absolute path");
    }
    for c in path.split('/') {
        match c {
            "" | "." => return Some("a path that is not normalised"),
            ".." => return Some("a path that climbs out with '..'"),
            c if c.len() > NAME_MAX => return Some("a path component longer than NAME_MAX"),
            _ => {}
        }
    }
    None
}
