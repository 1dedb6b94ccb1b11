use super::*;

/// Every case of `testdata/apimachinery.tsv`: apimachinery's own answer.
#[test]
fn matches_apimachinery_parse_and_string() {
    let table = include_str!("testdata/apimachinery.tsv");
    let mut cases = 0;
    for line in table.lines().filter(|l| !l.starts_with('#')) {
        let cols: Vec<&str> = line.split('\t').collect();
        let [input, want, stored, sign] = cols[..] else {
            panic!("bad line {line:?}");
        };
        let got = Quantity::parse(input);
        if want == "ERR" {
            assert!(got.is_none(), "{input:?} should be rejected: {got:?}");
            assert!(!is_valid(input) && !is_positive(input));
            continue;
        }
        let q = got.unwrap_or_else(|| panic!("{input:?} should parse"));
        assert_eq!(q.to_string(), want, "{input:?}");
        assert_eq!(canonical(input).as_deref(), Some(stored), "{input:?}");
        let want_sign = match sign {
            "-1" => Ordering::Less,
            "0" => Ordering::Equal,
            _ => Ordering::Greater,
        };
        assert_eq!(q.sign(), want_sign, "{input:?}");
        assert_eq!(is_positive(input), want_sign == Ordering::Greater);
        cases += 1;
    }
    assert!(cases > 300, "{cases}");
}

#[test]
fn issue_examples() {
    for (input, want) in [
        ("1.5Gi", "1536Mi"),
        ("1000M", "1G"),
        (".5Gi", "512Mi"),
        ("2048Mi", "2Gi"),
        ("1024Ki", "1Mi"),
        ("5Gi", "5Gi"),
        ("5n", "1m"),
        ("1.5e-5", "1e-3"),
    ] {
        assert_eq!(canonical(input).as_deref(), Some(want), "{input}");
        // Canonical forms are fixed points.
        assert_eq!(canonical(want).as_deref(), Some(want));
    }
    assert_eq!(canonical_or_same(""), "");
    assert_eq!(canonical_or_same("1 Gi"), "1 Gi");
}

#[test]
fn positivity_as_upstream_validates_sizes() {
    for ok in [
        "1", "1Gi", "1.5Gi", ".5Gi", "1.", "+1Gi", "100m", "1e3", "1E3", "1e-3", "2E", "1k", "1M",
        "1Ti", "0.0001", "0.1n",
    ] {
        assert!(is_positive(ok), "{ok:?}");
    }
    for bad in [
        "", "0", "0Gi", "-1Gi", "-0", "1gi", "1K", "1 Gi", " 1Gi", "1Gi ", ".", "Gi", "1e",
        "1.2.3", "1Gib", "++1",
    ] {
        assert!(!is_positive(bad), "{bad:?}");
    }
    assert!(is_valid("-1Gi"));
    assert!(!is_valid("1 Gi"));
}
