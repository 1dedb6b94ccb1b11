//! The import graph's rules (issue 33): no loops between the crate's
//! modules, and no arrow up the layer order that `src/lib.rs` documents
//! ([`LAYERS`] here is that order; change both together).
//!
//! Reads every file under `src/` (not `src/bin/`: the binaries sit above
//! everything and name the library `context_service::`), without comments,
//! doc comments and string literals, and collects every path that starts
//! with `crate::`, `super::` or `self::`, in `use` items (groups included)
//! and in code and attributes alike. Then:
//!
//! - top-level modules: every arrow goes to a strictly lower layer, so none
//!   goes up and none can close a loop; a module missing from [`LAYERS`]
//!   fails too, so that a new one is given its place;
//! - inside every module that has sub-modules: the sub-modules form no
//!   loop. A path through the parent's re-export (`super::ApiError`, with
//!   `pub use error::ApiError` in `api/mod.rs`) is an arrow to the
//!   sub-module that re-exports it; the parent's own items are no node.
//!   `#[cfg(test)]` modules are exempt from this one check: a test may
//!   drive a lower sub-module with a fixture of a higher one (the JSON
//!   decoder's tests decode with the pool handler's schema), and no test
//!   code ships. At the top level they count like any other code.
//!
//! Not seen: the items a glob import (`use super::*`) brings, and the
//! methods an `impl` block in another file adds to a type.
//!
//! Run alone with `cargo test --test api layers::`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level modules, top layer first. A module may use only modules
/// of the layers below its own: not its own layer's, not those above.
const LAYERS: &[&[&str]] = &[
    // `contextctl`'s commands.
    &["cli"],
    // The front ends: the API's HTTP client, the server process, the
    // offline store migration, logging set-up.
    &["client", "server", "migrate", "telemetry"],
    // The HTTP handlers.
    &["api"],
    // The state the handlers share, built from the settings.
    &["app"],
    // The settings, and their conversion into each component's settings.
    &["config"],
    // The sandbox backends: they implement the pool and delivery ports.
    &["sandbox"],
    // The domain services.
    &["delivery"],
    &["workload"],
    &["pool", "auth"],
    // Storage and the bundle cache.
    &["store", "cache"],
    // Leaves.
    &[
        "bundle", "clock", "fsutil", "metrics", "runtime", "tls", "zerocopy",
    ],
];

#[test]
fn no_loop_and_no_upward_arrow() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    read_tree(&root.join("src"), "src", &mut files);
    let problems = check(&files, LAYERS);
    assert!(
        problems.is_empty(),
        "the import graph breaks the layer order of src/lib.rs:\n{}",
        problems.join("\n")
    );
}

/// Every `.rs` file under `dir` (named `prefix/...`), but `src/bin/`.
fn read_tree(dir: &Path, prefix: &str, files: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("file name");
        let rel = format!("{prefix}/{name}");
        if path.is_dir() {
            if rel != "src/bin" {
                read_tree(&path, &rel, files);
            }
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(&path).expect("source file");
            files.push((rel, text));
        }
    }
}

/// The problems of the tree `files` (`src/...` paths and their text)
/// against `layers`, one line (or block) each with `file:line`.
fn check(files: &[(String, String)], layers: &[&[&str]]) -> Vec<String> {
    let parsed: Vec<Parsed> = files
        .iter()
        .filter_map(|(path, text)| Some(parse(path, module_of(path)?, text)))
        .collect();
    // Which modules are `#[cfg(test)]`, and what each module re-exports.
    let mut test_modules = BTreeSet::new();
    let mut children: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    let mut reexports: BTreeMap<Vec<String>, BTreeMap<String, String>> = BTreeMap::new();
    for file in &parsed {
        for (module, is_test) in &file.declared {
            if *is_test {
                test_modules.insert(module.clone());
            }
            let (name, parent) = module.split_last().expect("a declared module has a name");
            children
                .entry(parent.to_vec())
                .or_default()
                .insert(name.clone());
        }
        for (module, name, child) in &file.reexports {
            reexports
                .entry(module.clone())
                .or_default()
                .insert(name.clone(), child.clone());
        }
    }
    let is_test =
        |module: &[String]| (1..=module.len()).any(|n| test_modules.contains(&module[..n]));
    let mut problems = Vec::new();

    // Top level: every arrow goes down the layers.
    let layer_of = |module: &str| layers.iter().position(|layer| layer.contains(&module));
    let top = children.get(&Vec::new()).cloned().unwrap_or_default();
    for module in &top {
        if layer_of(module).is_none() {
            problems.push(format!(
                "module `{module}` has no layer: give it one in LAYERS (tests/api/layers.rs) and src/lib.rs"
            ));
        }
    }
    let mut top_edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for file in &parsed {
        for r in &file.refs {
            let (Some(from), Some(to)) = (r.from.first(), r.to.first()) else {
                continue;
            };
            if from == to || !top.contains(to) {
                continue;
            }
            top_edges
                .entry((from.clone(), to.clone()))
                .or_default()
                .push(format!("{}:{}", file.path, r.line));
        }
    }
    dedup(&mut top_edges);
    for ((from, to), places) in &top_edges {
        if let (Some(a), Some(b)) = (layer_of(from), layer_of(to)) {
            if a >= b {
                let how = if a == b {
                    "within its own layer"
                } else {
                    "up the layers"
                };
                for place in places {
                    problems.push(format!("{place}: `{from}` → `{to}` goes {how}"));
                }
            }
        }
    }
    problems.extend(loops("the top-level modules", &top_edges));

    // Inside each module: no loop between its sub-modules.
    for (parent, kids) in &children {
        if parent.is_empty() {
            continue;
        }
        let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for file in &parsed {
            for r in &file.refs {
                if is_test(&r.from) || !r.from.starts_with(parent) || !r.to.starts_with(parent) {
                    continue;
                }
                let (Some(from), Some(seg)) = (r.from.get(parent.len()), r.to.get(parent.len()))
                else {
                    continue;
                };
                let to = if kids.contains(seg) {
                    seg
                } else if let Some(child) = reexports.get(parent).and_then(|r| r.get(seg)) {
                    child
                } else {
                    continue; // the parent's own item
                };
                if from != to {
                    edges
                        .entry((from.clone(), to.clone()))
                        .or_default()
                        .push(format!("{}:{}", file.path, r.line));
                }
            }
        }
        problems.extend(loops(
            &format!("the sub-modules of `{}`", parent.join("::")),
            &edges,
        ));
    }
    problems
}

/// Each place once (a `use` group names a module once per item).
fn dedup(edges: &mut BTreeMap<(String, String), Vec<String>>) {
    for places in edges.values_mut() {
        places.dedup();
    }
}

/// One problem per loop of `edges` (strongly connected set of nodes), with
/// the places of the arrows that make it.
fn loops(what: &str, edges: &BTreeMap<(String, String), Vec<String>>) -> Vec<String> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
    }
    let reach = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start];
        while let Some(node) = todo.pop() {
            for &n in next.get(node).into_iter().flatten() {
                if seen.insert(n) {
                    todo.push(n);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<&str>> =
        next.keys().map(|&node| (node, reach(node))).collect();
    let mut done = BTreeSet::new();
    let mut problems = Vec::new();
    for (&node, reached) in &reaches {
        if done.contains(node) || !reached.contains(node) {
            continue;
        }
        // The loop's nodes: those that reach `node` and that it reaches.
        let members: BTreeSet<&str> = reached
            .iter()
            .copied()
            .filter(|m| reaches.get(m).is_some_and(|r| r.contains(node)))
            .collect();
        done.extend(members.iter().copied());
        let mut text = format!(
            "loop between {what} {}:",
            members
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for ((from, to), places) in edges {
            if members.contains(from.as_str()) && members.contains(to.as_str()) {
                for place in places {
                    text.push_str(&format!("\n    {place}: `{from}` → `{to}`"));
                }
            }
        }
        problems.push(text);
    }
    problems
}

/// The module path of a file: `src/api/json/mod.rs` is `api::json`;
/// `None` for a file that is no module (not under `src/`, not `.rs`).
fn module_of(path: &str) -> Option<Vec<String>> {
    let rel = path.strip_prefix("src/")?.strip_suffix(".rs")?;
    let mut module: Vec<String> = rel.split('/').map(str::to_owned).collect();
    if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
        module.pop();
    }
    Some(module)
}

/// One path a file names.
#[derive(Debug)]
struct Ref {
    line: usize,
    /// The module the path is written in (inline modules included).
    from: Vec<String>,
    /// The path, from the crate root.
    to: Vec<String>,
}

/// What one file says about the graph.
#[derive(Debug)]
struct Parsed {
    path: String,
    refs: Vec<Ref>,
    /// Modules it declares (`mod x;` and `mod x { … }`): full path, and
    /// whether `#[cfg(test)]` guards it.
    declared: Vec<(Vec<String>, bool)>,
    /// Its `pub use` of a child's item: (module, exported name, child).
    reexports: Vec<(Vec<String>, String, String)>,
}

/// A token: an identifier or keyword, `::`, or one punctuation character.
/// Comments, whitespace and literals are gone (a literal leaves `"`).
#[derive(Debug, Clone)]
struct Tok {
    text: String,
    line: usize,
}

fn lex(src: &str) -> Vec<Tok> {
    let s: Vec<char> = src.chars().collect();
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1);
    // Skips to `end` (exclusive), counting lines.
    let skip = |from: usize, end: usize, line: &mut usize| {
        *line += s[from..end.min(s.len())]
            .iter()
            .filter(|&&c| c == '\n')
            .count();
        end.min(s.len())
    };
    while i < s.len() {
        let c = s[i];
        if c.is_whitespace() {
            i = skip(i, i + 1, &mut line);
        } else if c == '/' && at(i + 1) == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let (mut j, mut depth) = (i + 2, 1);
            while j < s.len() && depth > 0 {
                if s[j] == '/' && at(j + 1) == '*' {
                    depth += 1;
                    j += 2;
                } else if s[j] == '*' && at(j + 1) == '/' {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            i = skip(i, j, &mut line);
        } else if let Some(end) = raw_string_end(&s, i) {
            toks.push(Tok {
                text: "\"".into(),
                line,
            });
            i = skip(i, end, &mut line);
        } else if c == '"' || (c == 'b' && at(i + 1) == '"') {
            let mut j = if c == '"' { i + 1 } else { i + 2 };
            while j < s.len() && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            toks.push(Tok {
                text: "\"".into(),
                line,
            });
            i = skip(i, j + 1, &mut line);
        } else if c == '\'' || (c == 'b' && at(i + 1) == '\'') {
            let q = if c == '\'' { i } else { i + 1 };
            if at(q + 1) == '\\' {
                // An escaped character: up to the closing quote.
                let mut j = q + 2;
                while j < s.len() && s[j] != '\'' {
                    j += 1;
                }
                toks.push(Tok {
                    text: "'".into(),
                    line,
                });
                i = j + 1;
            } else if at(q + 2) == '\'' {
                toks.push(Tok {
                    text: "'".into(),
                    line,
                });
                i = q + 3;
            } else {
                // A lifetime or a label: its name lexes as an identifier.
                i = q + 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_') {
                i += 1;
            }
            toks.push(Tok {
                text: s[start..i].iter().collect(),
                line,
            });
        } else if c == ':' && at(i + 1) == ':' {
            toks.push(Tok {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            toks.push(Tok {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    toks
}

/// The end of the raw string literal (`r"…"`, `br#"…"#`) starting at `i`.
fn raw_string_end(s: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if s.get(j) == Some(&'b') {
        j += 1;
    }
    if s.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = s[j..].iter().take_while(|&&c| c == '#').count();
    j += hashes;
    if s.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < s.len() {
        if s[j] == '"'
            && s[j + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes
        {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(s.len())
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Reads the graph facts of the file `path`, module `module`.
fn parse(path: &str, module: Vec<String>, src: &str) -> Parsed {
    let toks = lex(src);
    let text = |i: usize| toks.get(i).map_or("", |t| t.text.as_str());
    let mut parsed = Parsed {
        path: path.to_owned(),
        refs: Vec::new(),
        declared: Vec::new(),
        reexports: Vec::new(),
    };
    // Inline modules open around the cursor: name and the brace depth
    // outside them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let current = |inline: &[(String, usize)]| {
        let mut m = module.clone();
        m.extend(inline.iter().map(|(name, _)| name.clone()));
        m
    };
    // Child modules this file declares (outside any block), for `use
    // child::…`.
    let mut kids = BTreeSet::new();
    let mut level = 0;
    for k in 0..toks.len() {
        match text(k) {
            "{" => level += 1,
            "}" => level -= 1,
            "mod" if level == 0 && is_ident(text(k + 1)) && matches!(text(k + 2), ";" | "{") => {
                kids.insert(text(k + 1).to_owned());
            }
            _ => {}
        }
    }
    let mut depth = 0;
    let mut test_next = false;
    let mut i = 0;
    while i < toks.len() {
        match text(i) {
            "#" if text(i + 1) == "[" || (text(i + 1) == "!" && text(i + 2) == "[") => {
                let open = if text(i + 1) == "[" { i + 1 } else { i + 2 };
                if (1..=4)
                    .map(|k| text(open + k))
                    .eq(["cfg", "(", "test", ")"])
                    && text(open + 5) == "]"
                {
                    test_next = true;
                }
                // The attribute's contents are read as code: paths in
                // `#[arg(default_value_t = crate::…)]` count.
                i = open + 1;
                continue;
            }
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if is_ident(text(i + 1)) && matches!(text(i + 2), ";" | "{") => {
                let name = text(i + 1).to_owned();
                let mut full = current(&inline);
                full.push(name.clone());
                parsed.declared.push((full, test_next));
                if text(i + 2) == "{" {
                    inline.push((name, depth));
                }
                test_next = false;
                i += 2;
                continue;
            }
            "use" => {
                let reexport = is_reexport(&toks, i);
                let from = current(&inline);
                let (trees, end) = use_trees(&toks, i + 1);
                for (segments, alias, line) in trees {
                    let Some(to) = resolve(&segments, &from, &kids, true) else {
                        continue;
                    };
                    if reexport && to.len() > from.len() + 1 && to.starts_with(&from) {
                        let name = alias.unwrap_or_else(|| to.last().cloned().unwrap_or_default());
                        parsed
                            .reexports
                            .push((from.clone(), name, to[from.len()].clone()));
                    }
                    parsed.refs.push(Ref {
                        line,
                        from: from.clone(),
                        to,
                    });
                }
                test_next = false;
                i = end;
                continue;
            }
            "crate" | "super" | "self"
                if text(i + 1) == "::" && !matches!(text(i.wrapping_sub(1)), "$" | "::" | "in") =>
            {
                let line = toks[i].line;
                let mut segments = Vec::new();
                let mut j = i;
                while is_ident(text(j)) {
                    segments.push(text(j).to_owned());
                    if text(j + 1) != "::" {
                        break;
                    }
                    j += 2;
                }
                let from = current(&inline);
                if let Some(to) = resolve(&segments, &from, &kids, false) {
                    parsed.refs.push(Ref { line, from, to });
                }
                i = j + 1;
                continue;
            }
            ";" | "fn" | "struct" | "enum" | "impl" | "const" | "static" | "type" | "trait" => {
                test_next = false;
            }
            _ => {}
        }
        i += 1;
    }
    parsed
}

/// Whether the `use` at `i` is `pub use` or `pub(…) use`.
fn is_reexport(toks: &[Tok], i: usize) -> bool {
    let text = |k: usize| toks.get(k).map_or("", |t| t.text.as_str());
    if i >= 1 && text(i - 1) == "pub" {
        return true;
    }
    // `pub ( crate ) use`, `pub ( in a :: b ) use`.
    if i >= 1 && text(i - 1) == ")" {
        let mut k = i - 1;
        while k > 0 && text(k) != "(" {
            k -= 1;
        }
        return k >= 1 && text(k - 1) == "pub";
    }
    false
}

/// The paths of a use tree: segments, alias, line.
type UsePaths = Vec<(Vec<String>, Option<String>, usize)>;

/// The paths of the use tree starting at `i` (segments, alias, line), and
/// the index after its `;`.
fn use_trees(toks: &[Tok], i: usize) -> (UsePaths, usize) {
    let text = |k: usize| toks.get(k).map_or("", |t| t.text.as_str());
    let mut out: Out = Vec::new();
    // Prefixes of the open groups.
    let mut stack: Vec<Vec<String>> = vec![Vec::new()];
    let mut segments: Vec<String> = Vec::new();
    let mut line = toks.get(i).map_or(0, |t| t.line);
    let mut k = i;
    type Out = UsePaths;
    fn flush(
        segments: &mut Vec<String>,
        stack: &[Vec<String>],
        alias: Option<String>,
        line: usize,
        out: &mut Out,
    ) {
        if !segments.is_empty() {
            let mut path = stack.last().cloned().unwrap_or_default();
            path.append(segments);
            out.push((path, alias, line));
        }
    }
    while k < toks.len() {
        match text(k) {
            ";" => {
                flush(&mut segments, &stack, None, line, &mut out);
                return (out, k + 1);
            }
            "::" if text(k + 1) == "{" => {
                let mut prefix = stack.last().cloned().unwrap_or_default();
                prefix.append(&mut segments);
                stack.push(prefix);
                k += 2;
                continue;
            }
            "," => flush(&mut segments, &stack, None, line, &mut out),
            "}" => {
                flush(&mut segments, &stack, None, line, &mut out);
                stack.pop();
            }
            "as" => {
                let alias = text(k + 1).to_owned();
                flush(&mut segments, &stack, Some(alias), line, &mut out);
                k += 2;
                continue;
            }
            "::" => {}
            t if is_ident(t) || t == "*" => {
                if segments.is_empty() {
                    line = toks[k].line;
                }
                segments.push(t.to_owned());
            }
            _ => {}
        }
        k += 1;
    }
    (out, k)
}

/// `segments` from the crate root, as written in module `from` whose child
/// modules are `kids`; `None` for another crate's path. In a `use`, a bare
/// first segment that names a child module is that child.
fn resolve(
    segments: &[String],
    from: &[String],
    kids: &BTreeSet<String>,
    in_use: bool,
) -> Option<Vec<String>> {
    let first = segments.first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => from.to_vec(),
        name if in_use && kids.contains(name) => from.to_vec(),
        _ => return None,
    };
    let mut rest = segments;
    if first == "crate" {
        rest = &segments[1..];
    }
    while let Some((head, tail)) = rest.split_first() {
        match head.as_str() {
            "self" => {}
            "super" => {
                base.pop()?;
            }
            _ => break,
        }
        rest = tail;
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

#[cfg(test)]
mod checker {
    use super::*;

    fn files(tree: &[(&str, &str)]) -> Vec<(String, String)> {
        tree.iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect()
    }

    const LAYERS: &[&[&str]] = &[&["high"], &["mid"], &["low", "tree"]];

    #[test]
    fn a_loop_and_an_upward_arrow_fail_with_their_places() {
        let tree = files(&[
            ("src/lib.rs", "pub mod high;\npub mod low;\npub mod mid;\npub mod tree;\n"),
            ("src/high.rs", "use crate::mid::M;\n"),
            // Upward (and with `high → mid` a loop), from code and a group.
            (
                "src/mid.rs",
                "use crate::{low::L, tree};\npub struct M;\nfn f() {\n    crate::high::h();\n}\n",
            ),
            // Comments, doc comments and literals name no module.
            (
                "src/low.rs",
                "// use crate::high::X;\n/// [`crate::high`]\n/* crate::mid */ const S: &str = \"crate::high::X\";\nconst C: char = '\"'; fn g<'a>(x: &'a str) {}\nconst R: &str = r#\"crate::mid\"#;\n",
            ),
            (
                "src/tree/mod.rs",
                "mod a;\nmod b;\nmod c;\n#[cfg(test)]\nmod tests;\npub use b::B;\n",
            ),
            // `a → b` through the parent's re-export, `b → a` directly.
            (
                "src/tree/a.rs",
                "use super::B;\npub fn g() {}\n#[cfg(test)]\nmod tests {\n    use super::super::c;\n}\n",
            ),
            ("src/tree/b.rs", "pub struct B;\nfn f() {\n    super::a::g();\n}\n"),
            // A test module may close a loop: exempt.
            ("src/tree/c.rs", "use super::a;\n"),
            ("src/tree/tests.rs", "use super::a::*;\nuse super::c::*;\n"),
        ]);
        let problems = check(&tree, LAYERS);
        let all = problems.join("\n");
        assert!(
            all.contains("src/mid.rs:4: `mid` → `high` goes up the layers"),
            "{all}"
        );
        assert!(
            all.contains("loop between the top-level modules `high`, `mid`"),
            "{all}"
        );
        assert!(all.contains("src/high.rs:1: `high` → `mid`"), "{all}");
        assert!(
            all.contains("loop between the sub-modules of `tree` `a`, `b`"),
            "{all}"
        );
        assert!(all.contains("src/tree/a.rs:1: `a` → `b`"), "{all}");
        assert!(all.contains("src/tree/b.rs:3: `b` → `a`"), "{all}");
        assert!(
            !all.contains("low.rs"),
            "comments and literals are no paths: {all}"
        );
        assert!(
            !all.contains("`c`"),
            "test modules are exempt inside a module: {all}"
        );
        assert_eq!(problems.len(), 3, "{all}");
    }

    #[test]
    fn arrows_down_the_layers_pass_and_a_module_without_a_layer_fails() {
        let tree = files(&[
            ("src/lib.rs", "pub mod high;\npub mod low;\n"),
            (
                "src/high.rs",
                "use crate::low;\n#[arg(default_value_t = crate::low::N)]\nstruct S;\n",
            ),
            ("src/low.rs", "pub const N: u32 = 1;\n"),
        ]);
        assert_eq!(check(&tree, LAYERS), Vec::<String>::new());
        let tree = files(&[("src/lib.rs", "pub mod nowhere;\n"), ("src/nowhere.rs", "")]);
        let problems = check(&tree, LAYERS);
        assert!(
            problems[0].contains("module `nowhere` has no layer"),
            "{problems:?}"
        );
    }

    #[test]
    fn an_upward_arrow_inside_an_attribute_or_a_test_counts_at_the_top() {
        let tree = files(&[
            ("src/lib.rs", "pub mod high;\npub mod low;\n"),
            ("src/high.rs", ""),
            (
                "src/low.rs",
                "#[arg(default_value_t = crate::high::N)]\nstruct S;\n#[cfg(test)]\nmod tests {\n    use crate::high;\n}\n",
            ),
        ]);
        let problems = check(&tree, LAYERS);
        assert_eq!(
            problems,
            [
                "src/low.rs:1: `low` → `high` goes up the layers",
                "src/low.rs:5: `low` → `high` goes up the layers",
            ]
        );
    }
}
