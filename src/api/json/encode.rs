//! JSON written the way Go's `encoding/json` encoder writes it: one value,
//! then `\n` (what `json.NewEncoder(w).Encode(v)` produces), with `<`, `>`,
//! `&`, U+2028 and U+2029 escaped as `\u003c`, `\u003e`, `\u0026`,
//! `\u2028`, `\u2029` (Go's default HTML-safe escaping). Every other escape
//! (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u00XX` in lowercase hex)
//! is already the same in serde_json.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::Formatter;

/// serde_json's compact formatter plus Go's HTML-safe escapes.
struct GoFormatter;

impl Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let escape = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(escape.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

/// `value` as Go's `json.Encoder.Encode` writes it, trailing `\n` included.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(128);
    value.serialize(&mut serde_json::Serializer::with_formatter(
        &mut out,
        GoFormatter,
    ))?;
    out.push(b'\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_go() {
        // Expected bytes from Go 1.26: json.NewEncoder(os.Stdout).Encode(...).
        let cases: &[(&str, &str)] = &[
            ("a<b>&c", "\"a\\u003cb\\u003e\\u0026c\"\n"),
            ("\u{2028}x\u{2029}", "\"\\u2028x\\u2029\"\n"),
            (
                "tab\t nl\n cr\r bs\u{8} ff\u{c}",
                "\"tab\\t nl\\n cr\\r bs\\b ff\\f\"\n",
            ),
            ("\u{1}\u{1f}\u{7f}é", "\"\\u0001\\u001f\u{7f}é\"\n"),
            ("q\"b\\", "\"q\\\"b\\\\\"\n"),
            ("", "\"\"\n"),
        ];
        for (input, want) in cases {
            let got = String::from_utf8(to_vec(input).unwrap()).unwrap();
            assert_eq!(&got, want, "{input:?}");
        }
        let map = serde_json::json!({"error": "x", "message": "<&>"});
        assert_eq!(
            String::from_utf8(to_vec(&map).unwrap()).unwrap(),
            "{\"error\":\"x\",\"message\":\"\\u003c\\u0026\\u003e\"}\n"
        );
    }
}
