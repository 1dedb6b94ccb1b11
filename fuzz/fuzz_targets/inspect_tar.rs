//! Structure-aware: arbitrary tar headers (names, type flags, sizes that
//! may lie, PAX and GNU long-name extensions, raw byte tweaks, endings)
//! inside a valid gzip stream, so the fuzzer spends its time past the
//! gzip layer.
#![no_main]

#[path = "common.rs"]
mod common;

use std::io::Write;

use arbitrary::Arbitrary;

#[derive(Arbitrary, Debug)]
enum Name {
    Plain(u8),
    Nested(u8, u8),
    DotSlash(u8),
    Raw(Vec<u8>),
}

impl Name {
    fn bytes(&self) -> Vec<u8> {
        let c = |n: u8| [b'a' + n % 4];
        match self {
            Name::Plain(n) => c(*n).to_vec(),
            Name::Nested(a, b) => [&c(*a)[..], b"/", &c(*b)[..]].concat(),
            Name::DotSlash(n) => [&b"./"[..], &c(*n)[..]].concat(),
            Name::Raw(v) => v.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Extension {
    None,
    PaxPath(Name),
    PaxSize(u64),
    PaxRaw(Vec<u8>),
    GnuLongName(Name),
    GnuLongLink(Vec<u8>),
    Global(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Member {
    name: Name,
    type_flag: u8,
    mode: u16,
    /// Declared size differs from the data length by this much when set.
    size_lie: Option<i16>,
    data: Vec<u8>,
    extension: Extension,
    /// Overwrite one header byte after the checksum is set, then maybe fix
    /// the checksum again.
    tweak: Option<(u16, u8, bool)>,
}

#[derive(Arbitrary, Debug)]
enum Ending {
    Marker,
    OneBlock,
    None,
    Junk(Vec<u8>),
    Padding(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    members: Vec<Member>,
    ending: Ending,
    level: u8,
}

fn pad(out: &mut Vec<u8>) {
    let rem = out.len() % 512;
    if rem != 0 {
        out.resize(out.len() + 512 - rem, 0);
    }
}

fn pax(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3;
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    let mut v = format!("{len} {key}=").into_bytes();
    v.extend_from_slice(value);
    v.push(b'\n');
    v
}

fn header(name: &[u8], type_flag: u8, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    let n = name.len().min(100);
    h.as_old_mut().name[..n].copy_from_slice(&name[..n]);
    h.set_entry_type(tar::EntryType::new(type_flag));
    h.set_mode(mode);
    h.set_size(size);
    h.set_cksum();
    h
}

fn push_ext(out: &mut Vec<u8>, ty: u8, data: &[u8]) {
    out.extend_from_slice(header(b"ext", ty, 0o644, data.len() as u64).as_bytes());
    out.extend_from_slice(data);
    pad(out);
}

fn build(input: &Input) -> Vec<u8> {
    let mut out = Vec::new();
    for m in input.members.iter().take(64) {
        match &m.extension {
            Extension::None => {}
            Extension::PaxPath(n) => push_ext(&mut out, b'x', &pax("path", &n.bytes())),
            Extension::PaxSize(s) => {
                push_ext(&mut out, b'x', &pax("size", s.to_string().as_bytes()))
            }
            Extension::PaxRaw(raw) => push_ext(&mut out, b'x', raw),
            Extension::GnuLongName(n) => push_ext(&mut out, b'L', &n.bytes()),
            Extension::GnuLongLink(v) => push_ext(&mut out, b'K', v),
            Extension::Global(raw) => push_ext(&mut out, b'g', raw),
        }
        // Mostly plausible type flags, sometimes anything.
        let ty = match m.type_flag % 16 {
            0..=5 => b'0',
            6..=8 => b'5',
            9 => b'2',
            10 => b'1',
            11 => b'\0',
            _ => m.type_flag,
        };
        let len = m.data.len() as i64;
        let size = m.size_lie.map_or(len, |d| (len + i64::from(d)).max(0)) as u64;
        let mut h = header(&m.name.bytes(), ty, u32::from(m.mode), size);
        if let Some((at, byte, fix)) = m.tweak {
            h.as_mut_bytes()[usize::from(at) % 512] = byte;
            if fix {
                h.set_cksum();
            }
        }
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&m.data);
        pad(&mut out);
    }
    match &input.ending {
        Ending::Marker => out.extend_from_slice(&[0u8; 1024]),
        Ending::OneBlock => out.extend_from_slice(&[0u8; 512]),
        Ending::None => {}
        Ending::Junk(j) => {
            out.extend_from_slice(&[0u8; 1024]);
            out.extend_from_slice(j);
        }
        Ending::Padding(n) => out.resize(out.len() + 1024 + 512 * usize::from(*n % 20), 0),
    }
    let mut enc = flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::new(u32::from(input.level % 10)),
    );
    enc.write_all(&out).unwrap();
    enc.finish().unwrap()
}

libfuzzer_sys::fuzz_target!(|input: Input| {
    common::check(&build(&input));
});
