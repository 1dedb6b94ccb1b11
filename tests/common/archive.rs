//! Helpers shared by the bundle tests: crafting archives, including ones
//! the `tar` builder refuses to write.

use std::io::Write;

use context_service::bundle::{self, BundleError, CanonicalOptions, Limits, Report};
use flate2::write::GzEncoder;
use flate2::Compression;

/// gzip at level 6.
pub(crate) fn gz(data: &[u8]) -> Vec<u8> {
    gz_level(data, 6)
}

/// gzip at `level`.
pub(crate) fn gz_level(data: &[u8], level: u32) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::new(level));
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// A ustar header whose name bytes are written verbatim (no validation).
pub(crate) fn raw_header(name: &[u8], type_flag: u8, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_entry_type(tar::EntryType::new(type_flag));
    h.set_mode(if type_flag == b'5' { 0o755 } else { 0o644 });
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    h
}

/// PAX extended header records (`"%d key=value\n"`).
pub(crate) fn pax_records(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in records {
        let rest = key.len() + value.len() + 3;
        let mut len = rest + 1;
        while len != rest + len.to_string().len() {
            len = rest + len.to_string().len();
        }
        out.extend_from_slice(format!("{len} {key}=").as_bytes());
        out.extend_from_slice(value);
        out.push(b'\n');
    }
    out
}

/// Raw tar stream under construction.
#[derive(Default)]
pub(crate) struct TarBuf(pub Vec<u8>);

impl TarBuf {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Appends `header` and `data`, padded to a block.
    pub(crate) fn raw(mut self, header: &tar::Header, data: &[u8]) -> Self {
        self.0.extend_from_slice(header.as_bytes());
        self.0.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    pub(crate) fn file(self, name: &str, data: &[u8]) -> Self {
        let h = raw_header(name.as_bytes(), b'0', data.len() as u64);
        self.raw(&h, data)
    }

    pub(crate) fn dir(self, name: &str) -> Self {
        let h = raw_header(name.as_bytes(), b'5', 0);
        self.raw(&h, &[])
    }

    /// A member with type flag `ty` and no data.
    pub(crate) fn typed(self, name: &str, ty: u8) -> Self {
        let h = raw_header(name.as_bytes(), ty, 0);
        self.raw(&h, &[])
    }

    /// A PAX `x` header for the next member.
    pub(crate) fn pax(self, records: &[(&str, &[u8])]) -> Self {
        let data = pax_records(records);
        let h = raw_header(b"./PaxHeaders/x", b'x', data.len() as u64);
        self.raw(&h, &data)
    }

    /// The end-of-archive marker.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.0.extend_from_slice(&[0u8; 1024]);
        self.0
    }
}

/// Runs both faces (inspect and canonicalize) and checks they agree.
pub(crate) fn check(gzipped: &[u8], limits: &Limits) -> Result<Report, BundleError> {
    let inspected = bundle::inspect(gzipped, limits);
    let mut out = Vec::new();
    let report = bundle::canonicalize(gzipped, limits, &CanonicalOptions::default(), &mut out);
    match (&inspected, &report) {
        (Ok(i), Ok(r)) => assert_eq!(*i, r.inspection()),
        (Err(a), Err(b)) => {
            assert_eq!(a.code(), b.code());
            assert_eq!(a.entry(), b.entry());
        }
        _ => panic!("inspect and canonicalize disagree: {inspected:?} vs {report:?}"),
    }
    report
}

/// Expects the tar (gzipped here) to be rejected; returns the error.
pub(crate) fn reject_tar(tar: Vec<u8>) -> BundleError {
    match check(&gz(&tar), &Limits::default()) {
        Ok(r) => panic!("accepted: {r:?}"),
        Err(e) => e,
    }
}

/// Asserts a rejection's code and entry.
#[track_caller]
pub(crate) fn assert_rejected(err: &BundleError, code: &str, entry: Option<&str>) {
    assert_eq!(err.code(), code, "wrong code for {err}");
    assert_eq!(err.entry(), entry, "wrong entry for {err}");
}
