//! Secret files (the HS256 shared secret, the owner-scope key): their
//! format and the strength check a secret must pass before it is used.
//!
//! File format (`--hs256-secret-file`, `--owner-scope-secret-file`):
//! - `base64:<text>`: the secret is the standard base64 (RFC 4648, padding
//!   optional) decoding of `<text>`;
//! - `hex:<text>`: the secret is the hex decoding of `<text>`;
//! - anything else: the secret is the file's bytes exactly as stored, any
//!   bytes at all (a trailing newline is part of it).
//!
//! In the two prefixed forms one trailing `\n` (or `\r\n`) is stripped, as
//! editors add it; nothing else is trimmed. Whatever the form, the decoded
//! secret must be at least [`MIN_SECRET_BYTES`] long and hold at least
//! [`MIN_DISTINCT_BYTES`] distinct byte values.

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;

/// Standard base64 with padding optional.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Shortest HS256 secret accepted, in bytes (RFC 7518 §3.2: at least the
/// hash size).
pub const MIN_SECRET_BYTES: usize = 32;

/// Fewest distinct byte values an HS256 secret must hold: an all-one-byte
/// or two-letter secret is guessable whatever its length.
pub const MIN_DISTINCT_BYTES: usize = 8;

/// Why an HS256 secret is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// A `base64:` or `hex:` body does not decode.
    #[error("the {form} secret does not decode: {detail}")]
    Encoding {
        /// `base64` or `hex`.
        form: &'static str,
        /// The decoder's complaint.
        detail: String,
    },
    /// Fewer than [`MIN_SECRET_BYTES`] bytes.
    #[error("the secret must be at least {MIN_SECRET_BYTES} bytes; it is {0}")]
    TooShort(usize),
    /// Fewer than [`MIN_DISTINCT_BYTES`] distinct byte values.
    #[error(
        "the secret is trivially guessable: it holds {0} distinct byte values, at least {MIN_DISTINCT_BYTES} are required"
    )]
    LowEntropy(usize),
}

/// Decodes the contents of a secret file (see the module docs) and checks
/// the secret's strength.
pub fn parse_secret_file(contents: &[u8]) -> Result<Vec<u8>, SecretError> {
    let secret = if let Some(body) = contents.strip_prefix(b"base64:") {
        BASE64
            .decode(strip_one_newline(body))
            .map_err(|e| SecretError::Encoding {
                form: "base64",
                detail: e.to_string(),
            })?
    } else if let Some(body) = contents.strip_prefix(b"hex:") {
        hex::decode(strip_one_newline(body)).map_err(|e| SecretError::Encoding {
            form: "hex",
            detail: e.to_string(),
        })?
    } else {
        contents.to_vec()
    };
    check_strength(&secret)?;
    Ok(secret)
}

/// `Ok` when `secret` is long and varied enough to sign tokens with.
pub fn check_strength(secret: &[u8]) -> Result<(), SecretError> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(SecretError::TooShort(secret.len()));
    }
    let mut seen = [false; 256];
    for &b in secret {
        seen[usize::from(b)] = true;
    }
    let distinct = seen.iter().filter(|s| **s).count();
    if distinct < MIN_DISTINCT_BYTES {
        return Err(SecretError::LowEntropy(distinct));
    }
    Ok(())
}

fn strip_one_newline(body: &[u8]) -> &[u8] {
    body.strip_suffix(b"\r\n")
        .or_else(|| body.strip_suffix(b"\n"))
        .unwrap_or(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 32 distinct bytes, none of them valid UTF-8 on its own.
    fn non_utf8() -> Vec<u8> {
        (0x80u8..0xa0).collect()
    }

    #[test]
    fn raw_bytes_are_used_exactly() {
        let raw = non_utf8();
        assert_eq!(parse_secret_file(&raw).unwrap(), raw);
        let mut with_newline = raw.clone();
        with_newline.push(b'\n');
        assert_eq!(parse_secret_file(&with_newline).unwrap(), with_newline);
    }

    #[test]
    fn encoded_forms_strip_one_newline() {
        let raw = non_utf8();
        let b64 = base64::engine::general_purpose::STANDARD.encode(&raw);
        for text in [
            format!("base64:{b64}"),
            format!("base64:{b64}\n"),
            format!("base64:{b64}\r\n"),
            format!("base64:{}\n", b64.trim_end_matches('=')),
            format!("hex:{}\n", hex::encode(&raw)),
        ] {
            assert_eq!(parse_secret_file(text.as_bytes()).unwrap(), raw, "{text}");
        }
        let err = parse_secret_file(format!("hex:{}\n\n", hex::encode(&raw)).as_bytes());
        assert!(matches!(
            err,
            Err(SecretError::Encoding { form: "hex", .. })
        ));
        let err = parse_secret_file(b"base64:not base64!\n");
        assert!(matches!(
            err,
            Err(SecretError::Encoding { form: "base64", .. })
        ));
    }

    #[test]
    fn short_and_uniform_secrets_are_refused() {
        assert_eq!(parse_secret_file(b"short"), Err(SecretError::TooShort(5)));
        // Length is checked on the decoded bytes, not on the text.
        let hex16 = format!("hex:{}", hex::encode(&non_utf8()[..16]));
        assert_eq!(
            parse_secret_file(hex16.as_bytes()),
            Err(SecretError::TooShort(16))
        );
        assert_eq!(
            parse_secret_file(&[0xff; 64]),
            Err(SecretError::LowEntropy(1))
        );
        let two = b"abababababababababababababababababab";
        let err = parse_secret_file(two).unwrap_err();
        assert_eq!(err, SecretError::LowEntropy(2));
        assert!(err.to_string().contains("at least 8"), "{err}");
        assert!(check_strength(b"0123456789abcdef0123456789abcdef").is_ok());
    }
}
