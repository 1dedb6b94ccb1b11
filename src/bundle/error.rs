//! Why a bundle was rejected: one variant per rule, each with a stable
//! snake_case reason code and, where there is one, the offending entry.

use std::io;

/// What kind of link an archive tried to smuggle in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// A symbolic link (type flag `2`).
    Symbolic,
    /// A hard link (type flag `1`).
    Hard,
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LinkKind::Symbolic => "symbolic link",
            LinkKind::Hard => "hard link",
        })
    }
}

/// What kind of device node an archive contained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// A character device (type flag `3`).
    Char,
    /// A block device (type flag `4`).
    Block,
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Char => "character device",
            DeviceKind::Block => "block device",
        })
    }
}

/// A rejected bundle, or a failure to read or write one.
///
/// Entry names in messages are the archive's bytes decoded lossily, so a
/// hostile name cannot break a log line or a JSON document.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// Reading the input failed (client disconnect, disk error...). Not the
    /// bundle's fault.
    #[error("reading the bundle failed: {source}")]
    Io {
        /// The underlying error.
        source: io::Error,
        /// The file being read, for directory packing.
        entry: Option<String>,
    },
    /// Writing the spool, the canonical bundle or its output failed.
    #[error("writing the canonical bundle failed: {source}")]
    Storage {
        /// The underlying error.
        source: io::Error,
    },
    /// The temporary-space budget shared by concurrent uploads is used up.
    /// Not the bundle's fault; worth a retry.
    #[error("the temporary space for uploads ({limit} bytes) is in use; retry later")]
    TempSpaceExhausted {
        /// The budget in bytes.
        limit: u64,
    },
    /// The compressed input is larger than the limit.
    #[error("compressed bundle exceeds {limit} bytes")]
    CompressedTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The input inflates to more than the limit.
    #[error("bundle inflates to more than {limit} bytes")]
    InflatedTooLarge {
        /// The limit in bytes.
        limit: u64,
        /// The entry being read when the limit tripped, if any.
        entry: Option<String>,
    },
    /// More entries than the limit.
    #[error("bundle has more than {limit} entries (at {entry:?})")]
    TooManyEntries {
        /// The limit.
        limit: u64,
        /// The first entry over the limit.
        entry: String,
    },
    /// One file is larger than the per-file limit.
    #[error("file {entry:?} is {size} bytes, over the {limit}-byte limit")]
    FileTooLarge {
        /// The file.
        entry: String,
        /// Its declared size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// A path longer than the limit.
    #[error("path {entry:?} is {len} bytes, over the {limit}-byte limit")]
    PathTooLong {
        /// The path (possibly shortened for display).
        entry: String,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A path component longer than Linux `NAME_MAX` (255 bytes): no
    /// sandbox could extract it.
    #[error("path {entry:?} has a {len}-byte component, over the {limit}-byte limit")]
    NameTooLong {
        /// The path (possibly shortened for display).
        entry: String,
        /// The length of the first over-long component, in bytes.
        len: usize,
        /// The limit (255).
        limit: usize,
    },
    /// A path deeper than the limit.
    #[error("path {entry:?} is {depth} levels deep, over the limit of {limit}")]
    PathTooDeep {
        /// The path.
        entry: String,
        /// Its depth in components.
        depth: usize,
        /// The limit.
        limit: usize,
    },
    /// A path starting with `/`.
    #[error("absolute path {entry:?}")]
    AbsolutePath {
        /// The path.
        entry: String,
    },
    /// A path with a `..` component.
    #[error("path {entry:?} contains '..'")]
    PathTraversal {
        /// The path.
        entry: String,
    },
    /// A path with a backslash (a Windows separator or an escape trick).
    #[error("path {entry:?} contains a backslash")]
    Backslash {
        /// The path.
        entry: String,
    },
    /// A path with a NUL byte (possible only in PAX or GNU long names).
    #[error("path {entry:?} contains a NUL byte")]
    NulInPath {
        /// The path.
        entry: String,
    },
    /// An empty name, or one that normalises to nothing for a file.
    #[error("empty path {entry:?}")]
    EmptyPath {
        /// The name as written.
        entry: String,
    },
    /// A name that is not UTF-8.
    #[error("path {entry:?} is not valid UTF-8")]
    NonUtf8Path {
        /// The name, decoded lossily.
        entry: String,
    },
    /// The same path twice (after normalising `./`, `//` and trailing `/`).
    #[error("duplicate path {entry:?}")]
    DuplicatePath {
        /// The normalised path.
        entry: String,
    },
    /// A path used both as a file and as a directory.
    #[error("{entry:?} is both a file and a directory")]
    FileDirConflict {
        /// The normalised path.
        entry: String,
    },
    /// A symbolic or hard link.
    #[error("{kind} {entry:?} is not allowed")]
    LinkNotAllowed {
        /// The link's path.
        entry: String,
        /// Which kind of link.
        kind: LinkKind,
    },
    /// A character or block device.
    #[error("{kind} {entry:?} is not allowed")]
    DeviceNotAllowed {
        /// The device's path.
        entry: String,
        /// Which kind of device.
        kind: DeviceKind,
    },
    /// A named pipe.
    #[error("FIFO {entry:?} is not allowed")]
    FifoNotAllowed {
        /// The FIFO's path.
        entry: String,
    },
    /// A GNU sparse file (old `S` type or PAX `GNU.sparse.*` records).
    #[error("sparse file {entry:?} is not allowed")]
    SparseNotAllowed {
        /// The file's path.
        entry: String,
    },
    /// A type flag other than regular file or directory that has no rule of
    /// its own (GNU volume labels, dump dirs, vendor types, sockets...).
    #[error("entry {entry:?} has unsupported type {kind}")]
    UnknownEntryType {
        /// The entry's path.
        entry: String,
        /// The type flag or file type, for the message.
        kind: String,
    },
    /// A PAX global header that would change how later entries are read.
    #[error("PAX global header record {key:?} is not allowed")]
    PaxGlobalHeader {
        /// The first record key other than `comment`.
        key: String,
    },
    /// The gzip stream ends before its end.
    #[error("gzip stream is truncated")]
    TruncatedGzip,
    /// The input is not valid gzip (bad magic, corrupt deflate data, CRC or
    /// length mismatch).
    #[error("invalid gzip stream: {detail}")]
    InvalidGzip {
        /// What the decoder said.
        detail: String,
    },
    /// The input does not start with gzip's magic bytes (e.g. an
    /// uncompressed tar, or a zip).
    #[error("{}", fmt_not_gzip(*bare_tar))]
    NotGzip {
        /// The input is an uncompressed tar (`ustar` magic at offset 257).
        bare_tar: bool,
    },
    /// Bytes after the end of the gzip stream.
    #[error("trailing bytes after the gzip stream")]
    TrailingGarbage,
    /// The tar stream ends before its end-of-archive marker, or inside an
    /// entry.
    #[error("tar stream ends before its end-of-archive marker{}", fmt_entry(entry))]
    TruncatedTar {
        /// The entry being read, if the stream ended inside one.
        entry: Option<String>,
    },
    /// Non-zero bytes after the tar end-of-archive marker (inside the gzip
    /// stream): a place to smuggle data past other readers.
    #[error("data after the tar end-of-archive marker")]
    TarTrailingData,
    /// A malformed tar header (bad checksum, bad number, orphan extension
    /// header, directory with data, oversized extension record...).
    #[error("malformed tar archive{}: {detail}", fmt_entry(entry))]
    InvalidTar {
        /// The entry, when known.
        entry: Option<String>,
        /// What is wrong.
        detail: String,
    },
    /// `checksums.json` is present but unreadable or of an unknown format.
    #[error("checksums.json is invalid: {detail}")]
    ChecksumsInvalid {
        /// What is wrong.
        detail: String,
    },
    /// A file's sha256 differs from `checksums.json`.
    #[error("sha256 of {entry:?} does not match checksums.json")]
    ChecksumMismatch {
        /// The file.
        entry: String,
    },
    /// `checksums.json` lists a file the archive does not contain.
    #[error("checksums.json lists {entry:?}, which is not in the bundle")]
    ChecksumFileMissing {
        /// The listed path.
        entry: String,
    },
    /// The archive contains a file `checksums.json` does not list.
    #[error("{entry:?} is not listed in checksums.json")]
    ChecksumFileUnlisted {
        /// The unlisted file.
        entry: String,
    },
    /// A bug or a crashed worker thread; never the client's fault.
    #[error("internal error: {detail}")]
    Internal {
        /// What happened.
        detail: String,
    },
}

fn fmt_entry(entry: &Option<String>) -> String {
    match entry {
        Some(e) => format!(" (in {e:?})"),
        None => String::new(),
    }
}

/// What a bundle upload must be, after the refusal of one that is not gzip.
pub const BUNDLE_EXPECTED: &str = "a bundle is a gzip-compressed tar (e.g. `tar -czf bundle.tgz -C <dir> .`), or upload a directory and contextctl packs it";

fn fmt_not_gzip(bare_tar: bool) -> String {
    if bare_tar {
        format!("the upload is a tar archive without gzip compression; {BUNDLE_EXPECTED}")
    } else {
        format!(
            "the upload is not gzip (it does not start with the bytes 1f 8b); {BUNDLE_EXPECTED}"
        )
    }
}

impl BundleError {
    /// The stable snake_case reason code (API error bodies, metrics labels,
    /// `contextctl` JSON output).
    pub fn code(&self) -> &'static str {
        match self {
            BundleError::Io { .. } => "io_error",
            BundleError::Storage { .. } => "storage_error",
            BundleError::TempSpaceExhausted { .. } => "temp_space_exhausted",
            BundleError::CompressedTooLarge { .. } => "compressed_too_large",
            BundleError::InflatedTooLarge { .. } => "inflated_too_large",
            BundleError::TooManyEntries { .. } => "too_many_entries",
            BundleError::FileTooLarge { .. } => "file_too_large",
            BundleError::PathTooLong { .. } => "path_too_long",
            BundleError::NameTooLong { .. } => "name_too_long",
            BundleError::PathTooDeep { .. } => "path_too_deep",
            BundleError::AbsolutePath { .. } => "absolute_path",
            BundleError::PathTraversal { .. } => "path_traversal",
            BundleError::Backslash { .. } => "backslash_in_path",
            BundleError::NulInPath { .. } => "nul_in_path",
            BundleError::EmptyPath { .. } => "empty_path",
            BundleError::NonUtf8Path { .. } => "non_utf8_path",
            BundleError::DuplicatePath { .. } => "duplicate_path",
            BundleError::FileDirConflict { .. } => "file_dir_conflict",
            BundleError::LinkNotAllowed { .. } => "link_not_allowed",
            BundleError::DeviceNotAllowed { .. } => "device_not_allowed",
            BundleError::FifoNotAllowed { .. } => "fifo_not_allowed",
            BundleError::SparseNotAllowed { .. } => "sparse_not_allowed",
            BundleError::UnknownEntryType { .. } => "unknown_entry_type",
            BundleError::PaxGlobalHeader { .. } => "pax_global_header",
            BundleError::TruncatedGzip => "truncated_gzip",
            BundleError::InvalidGzip { .. } | BundleError::NotGzip { .. } => "invalid_gzip",
            BundleError::TrailingGarbage => "trailing_garbage",
            BundleError::TruncatedTar { .. } => "truncated_tar",
            BundleError::TarTrailingData => "tar_trailing_data",
            BundleError::InvalidTar { .. } => "invalid_tar",
            BundleError::ChecksumsInvalid { .. } => "checksums_invalid",
            BundleError::ChecksumMismatch { .. } => "checksum_mismatch",
            BundleError::ChecksumFileMissing { .. } => "checksum_file_missing",
            BundleError::ChecksumFileUnlisted { .. } => "checksum_file_unlisted",
            BundleError::Internal { .. } => "internal_error",
        }
    }

    /// The offending entry, if the error is about one.
    pub fn entry(&self) -> Option<&str> {
        match self {
            BundleError::Io { entry, .. }
            | BundleError::InflatedTooLarge { entry, .. }
            | BundleError::TruncatedTar { entry }
            | BundleError::InvalidTar { entry, .. } => entry.as_deref(),
            BundleError::TooManyEntries { entry, .. }
            | BundleError::FileTooLarge { entry, .. }
            | BundleError::PathTooLong { entry, .. }
            | BundleError::NameTooLong { entry, .. }
            | BundleError::PathTooDeep { entry, .. }
            | BundleError::AbsolutePath { entry }
            | BundleError::PathTraversal { entry }
            | BundleError::Backslash { entry }
            | BundleError::NulInPath { entry }
            | BundleError::EmptyPath { entry }
            | BundleError::NonUtf8Path { entry }
            | BundleError::DuplicatePath { entry }
            | BundleError::FileDirConflict { entry }
            | BundleError::LinkNotAllowed { entry, .. }
            | BundleError::DeviceNotAllowed { entry, .. }
            | BundleError::FifoNotAllowed { entry }
            | BundleError::SparseNotAllowed { entry }
            | BundleError::UnknownEntryType { entry, .. }
            | BundleError::ChecksumMismatch { entry }
            | BundleError::ChecksumFileMissing { entry }
            | BundleError::ChecksumFileUnlisted { entry } => Some(entry),
            BundleError::ChecksumsInvalid { .. } => Some("checksums.json"),
            BundleError::Storage { .. }
            | BundleError::TempSpaceExhausted { .. }
            | BundleError::CompressedTooLarge { .. }
            | BundleError::PaxGlobalHeader { .. }
            | BundleError::TruncatedGzip
            | BundleError::InvalidGzip { .. }
            | BundleError::NotGzip { .. }
            | BundleError::TrailingGarbage
            | BundleError::TarTrailingData
            | BundleError::Internal { .. } => None,
        }
    }

    /// True for the "too large" class (HTTP 413): the compressed, inflated,
    /// per-file and entry-count limits.
    pub fn is_too_large(&self) -> bool {
        matches!(
            self,
            BundleError::CompressedTooLarge { .. }
                | BundleError::InflatedTooLarge { .. }
                | BundleError::TooManyEntries { .. }
                | BundleError::FileTooLarge { .. }
        )
    }

    /// True when the bundle itself is at fault (HTTP 400/413), false for
    /// I/O, storage and internal failures.
    pub fn is_rejection(&self) -> bool {
        !matches!(
            self,
            BundleError::Io { .. }
                | BundleError::Storage { .. }
                | BundleError::TempSpaceExhausted { .. }
                | BundleError::Internal { .. }
        )
    }
}
