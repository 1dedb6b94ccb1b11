//! What a run of the bundle engine reports: [`Inspection`] for every run,
//! and [`Report`] — the inspection plus the canonical bundle's digest and
//! size — when a canonical gzip was written.

use std::ops::Deref;

use serde::ser::{Serialize, SerializeStruct, Serializer};

/// What [`inspect`](super::inspect) computes: the [`Report`] without the
/// bundle digest and size, because no canonical gzip is written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inspection {
    /// sha256 of the canonical uncompressed tar, 64 lowercase hex digits.
    pub revision: String,
    /// Regular files in the tree.
    pub files: u64,
    /// Directories in the tree, implied parents included.
    pub dirs: u64,
    /// Entries of the canonical tar (`files + dirs`).
    pub entries: u64,
    /// Size of the canonical uncompressed tar (what `gzip -dc bundle | wc -c`
    /// prints; a sandbox may refuse more).
    pub inflated_bytes: u64,
    /// Compressed bytes read from the input (0 for a packed directory).
    pub compressed_bytes: u64,
    /// Bytes the input inflated to (what the inflated limit measured; for a
    /// packed directory, the canonical tar size).
    pub input_inflated_bytes: u64,
    /// Members of the input tar, extension headers not counted (for a
    /// packed directory, `entries`).
    pub input_entries: u64,
}

/// The full result of the upload path. Reads as its [`Inspection`] (through
/// `Deref`: `report.revision`, `report.files`, ...) plus the bundle's
/// digest and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Everything [`inspect`](super::inspect) also reports.
    pub inspection: Inspection,
    /// sha256 of the stored bundle (the bytes, never recomputed from the
    /// tree), 64 lowercase hex digits.
    pub bundle_digest: String,
    /// Size of the stored bundle.
    pub bundle_bytes: u64,
    /// How the stored bundle was made: `as-uploaded` (the upload's own
    /// bytes, already canonical) or the name of the canonical gzip
    /// encoding (compressor, version, level). The bundle digest depends on
    /// it, so it is recorded with every stored bundle.
    pub bundle_encoding: String,
}

impl Report {
    /// A copy of the fields [`inspect`](super::inspect) also reports.
    pub fn inspection(&self) -> Inspection {
        self.inspection.clone()
    }
}

impl Deref for Report {
    type Target = Inspection;

    fn deref(&self) -> &Inspection {
        &self.inspection
    }
}

/// One flat JSON object, keys in the order `contextctl bundle` has always
/// printed them.
impl Serialize for Report {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let i = &self.inspection;
        let mut s = serializer.serialize_struct("Report", 11)?;
        s.serialize_field("revision", &i.revision)?;
        s.serialize_field("bundleDigest", &self.bundle_digest)?;
        s.serialize_field("files", &i.files)?;
        s.serialize_field("dirs", &i.dirs)?;
        s.serialize_field("entries", &i.entries)?;
        s.serialize_field("inflatedBytes", &i.inflated_bytes)?;
        s.serialize_field("compressedBytes", &i.compressed_bytes)?;
        s.serialize_field("bundleBytes", &self.bundle_bytes)?;
        s.serialize_field("inputInflatedBytes", &i.input_inflated_bytes)?;
        s.serialize_field("inputEntries", &i.input_entries)?;
        s.serialize_field("bundleEncoding", &self.bundle_encoding)?;
        s.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_json_is_flat_and_keeps_its_key_order() {
        let report = Report {
            inspection: Inspection {
                revision: "r".into(),
                files: 1,
                dirs: 2,
                entries: 3,
                inflated_bytes: 4,
                compressed_bytes: 5,
                input_inflated_bytes: 6,
                input_entries: 7,
            },
            bundle_digest: "d".into(),
            bundle_bytes: 8,
            bundle_encoding: "e".into(),
        };
        assert_eq!(
            serde_json::to_string(&report).unwrap(),
            r#"{"revision":"r","bundleDigest":"d","files":1,"dirs":2,"entries":3,"inflatedBytes":4,"compressedBytes":5,"bundleBytes":8,"inputInflatedBytes":6,"inputEntries":7,"bundleEncoding":"e"}"#
        );
        assert_eq!(report.files, 1);
        assert_eq!(report.inspection(), report.inspection);
    }
}
