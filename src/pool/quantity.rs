//! The Kubernetes quantity grammar (apimachinery `ParseQuantity`), enough to
//! tell whether a size is a valid, positive quantity.

/// Whether `s` parses as a Kubernetes quantity with a value above zero.
///
/// Grammar: optional sign, digits with an optional fraction (`.5` and `1.`
/// allowed), then an optional suffix: binary (`Ki`..`Ei`), decimal SI (`n`,
/// `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`) or an exponent (`e3`, `E-2`).
/// No whitespace anywhere.
pub fn is_positive(s: &str) -> bool {
    parse(s).is_some_and(|q| q.nonzero && !q.negative)
}

/// Whether `s` is a syntactically valid quantity (any sign).
pub fn is_valid(s: &str) -> bool {
    parse(s).is_some()
}

struct Parsed {
    negative: bool,
    nonzero: bool,
}

fn parse(s: &str) -> Option<Parsed> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut negative = false;
    if let Some(&sign) = bytes.first() {
        if sign == b'+' || sign == b'-' {
            negative = sign == b'-';
            i = 1;
        }
    }
    let mut digits = 0;
    let mut nonzero = false;
    while i < bytes.len() && bytes[i].is_ascii_digit() {
        nonzero |= bytes[i] != b'0';
        digits += 1;
        i += 1;
    }
    if i < bytes.len() && bytes[i] == b'.' {
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            nonzero |= bytes[i] != b'0';
            digits += 1;
            i += 1;
        }
    }
    if digits == 0 {
        return None;
    }
    if !is_suffix(&s[i..]) {
        return None;
    }
    Some(Parsed { negative, nonzero })
}

fn is_suffix(suffix: &str) -> bool {
    match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T"
        | "P" | "E" => true,
        _ => {
            let Some(exp) = suffix.strip_prefix(['e', 'E']) else {
                return false;
            };
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && digits.len() <= 18
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_kubernetes_quantities() {
        for ok in [
            "1", "1Gi", "1.5Gi", ".5Gi", "1.", "+1Gi", "100m", "1e3", "1E3", "1e-3", "2E", "1k",
            "1M", "1Ti", "0.0001",
        ] {
            assert!(is_positive(ok), "{ok:?}");
        }
    }

    #[test]
    fn rejects_zero_negative_and_bad_syntax() {
        for bad in [
            "", "0", "0Gi", "-1Gi", "-0", "1gi", "1K", "1 Gi", " 1Gi", "1Gi ", ".", "Gi", "1e",
            "1.2.3", "1Gib", "++1",
        ] {
            assert!(!is_positive(bad), "{bad:?}");
        }
        assert!(is_valid("-1Gi"));
        assert!(!is_valid("1 Gi"));
    }
}
