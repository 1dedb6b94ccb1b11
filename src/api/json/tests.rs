//! The decoder against Go's own answers (`testdata/go_decode.jsonl`, made
//! by Go 1.26's `encoding/json` with upstream's request types).

use serde_json::Value;

use super::{decode_bytes, MAX_BODY};

#[test]
fn decodes_like_go_encoding_json() {
    let table = include_str!("testdata/go_decode.jsonl");
    let mut cases = 0;
    for line in table.lines() {
        let row: Vec<Value> = serde_json::from_str(line).unwrap();
        if row[0] == "#" {
            continue;
        }
        let schema = match row[0].as_str().unwrap() {
            "pool" => &crate::api::pools::CREATE_REQUEST,
            _ => &crate::api::volumes::CREATE_REQUEST,
        };
        let mut body = row[1].as_str().unwrap().as_bytes().to_vec();
        let pad = row[2].as_str().unwrap();
        for _ in 0..row[3].as_u64().unwrap() {
            body.extend_from_slice(pad.as_bytes());
        }
        body.extend_from_slice(row[4].as_str().unwrap().as_bytes());
        // What reading through the 1 MiB limit yields.
        let complete = body.len() <= MAX_BODY;
        body.truncate(MAX_BODY);
        let got = decode_bytes(&body, complete, schema);
        let shown = &row[1].as_str().unwrap()[..row[1].as_str().unwrap().len().min(60)];
        match row[5].as_str().unwrap() {
            "OK" => {
                let want: Value = serde_json::from_str(row[6].as_str().unwrap()).unwrap();
                let got = got.unwrap_or_else(|e| panic!("{shown:?}: {e}"));
                let mut got = got.to_value();
                // `ttl` is ours, not upstream's: absent from Go's answers.
                if let Some(fields) = got.as_object_mut() {
                    if row[0] == "pool" {
                        assert_eq!(fields.remove("ttl"), Some(Value::from("")), "{shown:?}");
                    }
                }
                assert_eq!(got, want, "{shown:?}");
            }
            _ => assert_eq!(
                got.map(|d| d.to_value()),
                Err(row[6].as_str().unwrap().to_owned()),
                "{shown:?}"
            ),
        }
        cases += 1;
    }
    assert!(cases > 130, "{cases}");
}

/// Bodies that are not UTF-8 (Go 1.26's answers): a byte above 0x7f is
/// quoted as the Latin-1 character of its value; in strings each invalid
/// byte becomes U+FFFD.
#[test]
fn raw_bytes_like_go() {
    let pool = &crate::api::pools::CREATE_REQUEST;
    let err = |body: &[u8]| decode_bytes(body, true, pool).unwrap_err();
    assert_eq!(
        err(b"\xff"),
        "invalid character '\u{ff}' looking for beginning of value"
    );
    assert_eq!(
        err(b"\x80"),
        "invalid character '\\u0080' looking for beginning of value"
    );
    assert_eq!(
        err(b"\xa0"),
        "invalid character '\\u00a0' looking for beginning of value"
    );
    assert_eq!(
        err(b"\xad"),
        "invalid character '\\u00ad' looking for beginning of value"
    );
    assert_eq!(
        err(b"\xe9"),
        "invalid character '\u{e9}' looking for beginning of value"
    );
    assert_eq!(
        err(b"\x1b"),
        "invalid character '\\x1b' looking for beginning of value"
    );
    assert_eq!(
        err(b"\\"),
        "invalid character '\\\\' looking for beginning of value"
    );
    assert_eq!(err(b"{\"\xff\":1}"), "json: unknown field \"\u{fffd}\"");
    assert_eq!(
        err(b"{\"\xe2\x82\":1}"),
        "json: unknown field \"\u{fffd}\u{fffd}\""
    );
    let ok = decode_bytes(b"{\"name\":\"\xff\xe2\x82A\xed\xa0\x80\"}", true, pool).unwrap();
    assert_eq!(
        ok.string("name"),
        "\u{fffd}\u{fffd}\u{fffd}A\u{fffd}\u{fffd}\u{fffd}"
    );
}
