//! The accepted tree: duplicate and file/directory conflict detection,
//! implied parent directories, and the sorted index the canonical archive is
//! emitted from. Memory is proportional to the entry count, which is
//! limited.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use super::error::BundleError;
use super::path::CanonPath;

/// Where a regular file's content lives and how it is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileNode {
    /// Size in bytes.
    pub size: u64,
    /// Owner-executable (the only mode bit kept, as git does).
    pub exec: bool,
    /// Where the content is: an offset in the spool, or an index into the
    /// packer's list of files.
    pub offset: u64,
}

/// One node of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Node {
    /// A directory. `explicit` is false when only implied by a child.
    Dir {
        /// Listed by its own archive member.
        explicit: bool,
    },
    /// A regular file.
    File(FileNode),
}

/// The accepted tree, keyed in canonical order.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    nodes: BTreeMap<CanonPath, Node>,
    files: u64,
    dirs: u64,
    /// The parent directory of the last path added: it and its ancestors
    /// are directories already, so the next path in the same directory
    /// (the common case: archives list a directory's files together)
    /// skips the ancestor walk. Nodes are never removed and a directory
    /// never becomes a file, so this stays true.
    last_parent: String,
}

impl Tree {
    /// Number of regular files.
    pub(crate) fn files(&self) -> u64 {
        self.files
    }

    /// Number of directories, implied ones included.
    pub(crate) fn dirs(&self) -> u64 {
        self.dirs
    }

    /// Nodes in canonical order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&CanonPath, &Node)> {
        self.nodes.iter()
    }

    /// Nodes in canonical order, freed as they go: a tree of many small
    /// files takes a while to free, and the emitter has the time to spare
    /// while the revision hasher is the bottleneck.
    pub(crate) fn into_nodes(self) -> impl Iterator<Item = (CanonPath, Node)> {
        self.nodes.into_iter()
    }

    /// The node at `path`, if any.
    pub(crate) fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(&CanonPath::from_trusted(path.to_owned()))
    }

    /// Creates the missing ancestors of `path` as implied directories;
    /// answers how many. They are always its innermost ones: every node's
    /// ancestors exist.
    fn ensure_parents(&mut self, path: &CanonPath) -> Result<usize, BundleError> {
        let parent = path.as_str().rsplit_once('/').map_or("", |(p, _)| p);
        if parent.is_empty() || parent == self.last_parent {
            return Ok(0);
        }
        let mut created = 0;
        for ancestor in path.ancestors() {
            let key = CanonPath::from_trusted(ancestor.to_owned());
            match self.nodes.entry(key) {
                Entry::Occupied(o) => {
                    if let Node::File(_) = o.get() {
                        return Err(BundleError::FileDirConflict {
                            entry: ancestor.to_owned(),
                        });
                    }
                }
                Entry::Vacant(v) => {
                    v.insert(Node::Dir { explicit: false });
                    self.dirs += 1;
                    created += 1;
                }
            }
        }
        parent.clone_into(&mut self.last_parent);
        Ok(created)
    }

    /// Adds an explicit directory. Answers how many nodes this created: see
    /// [`created_by`] for which (none when the directory was already
    /// implied).
    pub(crate) fn add_dir(&mut self, path: CanonPath) -> Result<usize, BundleError> {
        let parents = self.ensure_parents(&path)?;
        match self.nodes.get_mut(&path) {
            Some(Node::File(_)) => Err(BundleError::FileDirConflict {
                entry: path.as_str().to_owned(),
            }),
            Some(Node::Dir { explicit: true }) => Err(BundleError::DuplicatePath {
                entry: path.as_str().to_owned(),
            }),
            Some(Node::Dir { explicit }) => {
                *explicit = true;
                Ok(parents)
            }
            None => {
                self.nodes.insert(path, Node::Dir { explicit: true });
                self.dirs += 1;
                Ok(parents + 1)
            }
        }
    }

    /// Adds a regular file. Answers how many nodes this created (its
    /// implied parents and the file): see [`created_by`] for which.
    pub(crate) fn add_file(
        &mut self,
        path: CanonPath,
        file: FileNode,
    ) -> Result<usize, BundleError> {
        let parents = self.ensure_parents(&path)?;
        match self.nodes.entry(path) {
            Entry::Occupied(o) => {
                let entry = o.key().as_str().to_owned();
                Err(match o.get() {
                    Node::File(_) => BundleError::DuplicatePath { entry },
                    Node::Dir { .. } => BundleError::FileDirConflict { entry },
                })
            }
            Entry::Vacant(v) => {
                v.insert(Node::File(file));
                self.files += 1;
                Ok(parents + 1)
            }
        }
    }
}

/// The `created` nodes an add of `path` made, in canonical order: its
/// innermost `created - 1` ancestors, then `path` itself (nothing for 0).
/// Only a new node's ancestors can be new, and they are the innermost ones
/// because every existing node's ancestors exist.
pub(crate) fn created_by(path: &CanonPath, created: usize) -> impl Iterator<Item = &str> {
    let nodes = path.ancestors().count() + 1;
    path.ancestors()
        .chain(std::iter::once(path.as_str()))
        .skip(nodes.saturating_sub(created))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> CanonPath {
        CanonPath::from_trusted(s.to_owned())
    }

    const F: FileNode = FileNode {
        size: 0,
        exec: false,
        offset: 0,
    };

    #[test]
    fn implied_parents_then_explicit_dir_is_not_a_duplicate() {
        let mut t = Tree::default();
        let c = p("a/b/c");
        let created = t.add_file(c.clone(), F).unwrap();
        assert_eq!(
            created_by(&c, created).collect::<Vec<_>>(),
            ["a", "a/b", "a/b/c"]
        );
        assert_eq!(t.add_dir(p("a/b")).unwrap(), 0);
        assert_eq!(t.add_dir(p("a/b")).unwrap_err().code(), "duplicate_path");
        assert_eq!((t.files(), t.dirs()), (1, 2));
    }

    #[test]
    fn siblings_after_a_cached_parent_still_conflict_and_count() {
        let mut t = Tree::default();
        t.add_file(p("d/x"), F).unwrap();
        let y = p("d/y");
        let created = t.add_file(y.clone(), F).unwrap();
        assert_eq!(created_by(&y, created).collect::<Vec<_>>(), ["d/y"]);
        assert_eq!(
            t.add_file(p("d/x"), F).unwrap_err().code(),
            "duplicate_path"
        );
        t.add_dir(p("d/sub")).unwrap();
        let e = t.add_file(p("d/sub"), F).unwrap_err();
        assert_eq!(e.code(), "file_dir_conflict");
        // Another directory, then back: the walk runs again and still
        // sees the file `e` in the way.
        t.add_file(p("e"), F).unwrap();
        let e = t.add_file(p("e/z"), F).unwrap_err();
        assert_eq!((e.code(), e.entry()), ("file_dir_conflict", Some("e")));
        assert_eq!((t.files(), t.dirs()), (3, 2));
    }

    #[test]
    fn a_new_directory_creates_its_missing_parents_and_itself() {
        let mut t = Tree::default();
        t.add_file(p("x/f"), F).unwrap();
        let z = p("x/y/z");
        let created = t.add_dir(z.clone()).unwrap();
        assert_eq!(
            created_by(&z, created).collect::<Vec<_>>(),
            ["x/y", "x/y/z"]
        );
        assert_eq!(created_by(&z, 0).count(), 0);
        assert_eq!((t.files(), t.dirs()), (1, 3));
    }

    #[test]
    fn file_under_file_conflicts() {
        let mut t = Tree::default();
        t.add_file(p("a"), F).unwrap();
        let e = t.add_file(p("a/b"), F).unwrap_err();
        assert_eq!((e.code(), e.entry()), ("file_dir_conflict", Some("a")));
    }
}
