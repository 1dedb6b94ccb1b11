//! A frozen revision as an OCI image (image-spec v1.1): one manifest, one
//! config, one layer, all derived from the revision record alone, so the
//! manifest's digest never changes and needs nothing stored.
//!
//! The layer *is* the stored bundle: a gzip of the canonical tar, whose
//! sha256 is `bundleDigest` (the layer digest) and whose uncompressed
//! sha256 is the revision (the layer's `diff_id`). The config is a real
//! image config (`os`/`architecture`, `rootfs.diff_ids`), which container
//! runtimes need to unpack the image (image volumes, KEP-4639); the
//! manifest's `artifactType` says what the image holds. The layer carries
//! ORAS's unpack annotations, so `oras pull` extracts the tree in place.

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::view::BUNDLE_MEDIA_TYPE;
use crate::store::RevisionRecord;

/// Media type of the manifest.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of the config.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// Media type of the layer (the stored bundle).
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The manifest's `artifactType`: our bundle media type.
pub const ARTIFACT_TYPE: &str = BUNDLE_MEDIA_TYPE;

/// Layer annotation: the file or directory name (ORAS extracts there).
pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";
/// Layer and manifest annotation: the revision.
pub const ANNOTATION_REVISION: &str = "io.rossoctl.context.revision";
/// Layer and manifest annotation: the workload's name.
pub const ANNOTATION_WORKLOAD: &str = "io.rossoctl.context.workload";
/// ORAS: unpack this gzip tar as a directory.
pub const ANNOTATION_ORAS_UNPACK: &str = "io.deis.oras.content.unpack";
/// ORAS: the sha256 of the uncompressed tar, checked while unpacking.
pub const ANNOTATION_ORAS_DIGEST: &str = "io.deis.oras.content.digest";

/// The layer's title: `.`, the pull's own directory. ORAS resolves each tar
/// entry relative to the title, and canonical entries have no top-level
/// directory (they are the workload's files as uploaded).
pub const LAYER_TITLE: &str = ".";

/// The platform written in the config. The tree is data and fits every
/// platform; runtimes read these fields, and check them only against the
/// entries of an index (a single manifest is taken as it is).
pub const CONFIG_OS: &str = "linux";
/// See [`CONFIG_OS`].
pub const CONFIG_ARCHITECTURE: &str = "amd64";

/// One revision as an OCI image: the bytes of its manifest and config and
/// the digests (64 lowercase hex, without `sha256:`) clients ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciImage {
    /// The manifest, as served.
    pub manifest: Vec<u8>,
    /// sha256 of [`OciImage::manifest`].
    pub manifest_digest: String,
    /// The config, as served.
    pub config: Vec<u8>,
    /// sha256 of [`OciImage::config`].
    pub config_digest: String,
    /// The revision (the layer's `diff_id`).
    pub revision: String,
    /// The layer's digest: the stored bundle's.
    pub layer_digest: String,
    /// The layer's size: the stored bundle's.
    pub layer_bytes: u64,
}

#[derive(Serialize)]
struct Descriptor<'a> {
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    digest: String,
    size: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<&'a str, String>,
}

#[derive(Serialize)]
struct Manifest<'a> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    #[serde(rename = "artifactType")]
    artifact_type: &'a str,
    config: Descriptor<'a>,
    layers: [Descriptor<'a>; 1],
    annotations: BTreeMap<&'a str, String>,
}

#[derive(Serialize)]
struct RootFs<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    diff_ids: [String; 1],
}

#[derive(Serialize)]
struct Config<'a> {
    architecture: &'a str,
    os: &'a str,
    config: BTreeMap<&'a str, String>,
    rootfs: RootFs<'a>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl OciImage {
    /// The image of revision `rev` of workload `workload`. Deterministic:
    /// the same record always gives the same bytes.
    pub fn of(workload: &str, rev: &RevisionRecord) -> Self {
        let diff_id = format!("sha256:{}", rev.revision);
        let config = Config {
            architecture: CONFIG_ARCHITECTURE,
            os: CONFIG_OS,
            config: BTreeMap::new(),
            rootfs: RootFs {
                kind: "layers",
                diff_ids: [diff_id.clone()],
            },
        };
        // Serialising these plain structs cannot fail.
        let config = serde_json::to_vec(&config).unwrap_or_default();
        let config_digest = sha256_hex(&config);
        let ours = |extra: &[(&'static str, String)]| {
            let mut map: BTreeMap<&str, String> = BTreeMap::new();
            map.insert(ANNOTATION_REVISION, rev.revision.clone());
            map.insert(ANNOTATION_WORKLOAD, workload.to_owned());
            for (k, v) in extra {
                map.insert(k, v.clone());
            }
            map
        };
        let manifest = Manifest {
            schema_version: 2,
            media_type: MANIFEST_MEDIA_TYPE,
            artifact_type: ARTIFACT_TYPE,
            config: Descriptor {
                media_type: CONFIG_MEDIA_TYPE,
                digest: format!("sha256:{config_digest}"),
                size: config.len() as u64,
                annotations: BTreeMap::new(),
            },
            layers: [Descriptor {
                media_type: LAYER_MEDIA_TYPE,
                digest: format!("sha256:{}", rev.bundle_digest),
                size: rev.bytes,
                annotations: ours(&[
                    (ANNOTATION_TITLE, LAYER_TITLE.to_owned()),
                    (ANNOTATION_ORAS_UNPACK, "true".to_owned()),
                    (ANNOTATION_ORAS_DIGEST, diff_id),
                ]),
            }],
            annotations: ours(&[]),
        };
        let manifest = serde_json::to_vec(&manifest).unwrap_or_default();
        Self {
            manifest_digest: sha256_hex(&manifest),
            manifest,
            config_digest,
            config,
            revision: rev.revision.clone(),
            layer_digest: rev.bundle_digest.clone(),
            layer_bytes: rev.bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> RevisionRecord {
        RevisionRecord {
            revision: "ab".repeat(32),
            bundle_digest: "cd".repeat(32),
            files: 3,
            entries: 4,
            bytes: 1234,
            bundle_encoding: "gzip+zlib-rs+level-1".to_owned(),
            inflated_bytes: 10240,
            uploaded_at_ms: 1_700_000_000_000,
            tree: None,
        }
    }

    /// The digest of a fixed record's manifest is fixed: a change to the
    /// mapping changes every published reference, so it must be deliberate.
    #[test]
    fn golden_digests() {
        let image = OciImage::of("docs", &record());
        assert_eq!(
            String::from_utf8(image.config.clone()).unwrap(),
            format!(
                r#"{{"architecture":"amd64","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["sha256:{}"]}}}}"#,
                "ab".repeat(32)
            )
        );
        assert_eq!(image.config_digest, GOLDEN_CONFIG);
        assert_eq!(image.manifest_digest, GOLDEN_MANIFEST);
        assert_eq!(image.manifest_digest, sha256_hex(&image.manifest));
        assert_eq!(image.layer_digest, "cd".repeat(32));
        assert_eq!(image.layer_bytes, 1234);
    }

    // Computed independently (python3 hashlib over the expected JSON text).
    const GOLDEN_CONFIG: &str = "02058fdd3e3f840754a4a5302ee7841f9dab2a1773145d6fee190ac8bcbadb3e";
    const GOLDEN_MANIFEST: &str =
        "d281435b04e2293a67ed628a216b1be9a1406658270f9cf2f746e05155d91b4e";

    #[test]
    fn the_manifest_names_layer_config_and_revision() {
        let image = OciImage::of("docs", &record());
        let m: serde_json::Value = serde_json::from_slice(&image.manifest).unwrap();
        assert_eq!(m["schemaVersion"], 2);
        assert_eq!(m["mediaType"], MANIFEST_MEDIA_TYPE);
        assert_eq!(m["artifactType"], ARTIFACT_TYPE);
        assert_eq!(m["config"]["mediaType"], CONFIG_MEDIA_TYPE);
        assert_eq!(
            m["config"]["digest"],
            format!("sha256:{}", image.config_digest)
        );
        assert_eq!(m["config"]["size"], image.config.len());
        let layer = &m["layers"][0];
        assert_eq!(m["layers"].as_array().unwrap().len(), 1);
        assert_eq!(layer["mediaType"], LAYER_MEDIA_TYPE);
        assert_eq!(layer["digest"], format!("sha256:{}", "cd".repeat(32)));
        assert_eq!(layer["size"], 1234);
        let a = &layer["annotations"];
        assert_eq!(a[ANNOTATION_TITLE], ".");
        assert_eq!(a[ANNOTATION_REVISION], "ab".repeat(32));
        assert_eq!(a[ANNOTATION_WORKLOAD], "docs");
        assert_eq!(a[ANNOTATION_ORAS_UNPACK], "true");
        assert_eq!(
            a[ANNOTATION_ORAS_DIGEST],
            format!("sha256:{}", "ab".repeat(32))
        );
        let c: serde_json::Value = serde_json::from_slice(&image.config).unwrap();
        assert_eq!(
            c["rootfs"]["diff_ids"][0],
            format!("sha256:{}", "ab".repeat(32))
        );
    }

    #[test]
    fn another_workload_or_revision_is_another_manifest() {
        let a = OciImage::of("docs", &record());
        let b = OciImage::of("docs2", &record());
        assert_ne!(a.manifest_digest, b.manifest_digest);
        assert_eq!(a.config_digest, b.config_digest);
        let mut other = record();
        other.revision = "ef".repeat(32);
        let c = OciImage::of("docs", &other);
        assert_ne!(a.config_digest, c.config_digest);
        assert_ne!(a.manifest_digest, c.manifest_digest);
        // Stable across calls.
        assert_eq!(a, OciImage::of("docs", &record()));
    }
}
