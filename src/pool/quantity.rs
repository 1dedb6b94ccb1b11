//! Kubernetes quantities (`1Gi`, `1.5G`, `500m`, `1e3`) as apimachinery's
//! `resource.Quantity` parses and prints them.
//!
//! Sizes go back to clients in the form the Kubernetes API server stores
//! ([`canonical`]): `ParseQuantity(s)`, rounded up to a multiple of 10⁻³ (the
//! defaulting of every resource list), then `String()`. That is the
//! canonical form (`1.5Gi` → `1536Mi`, `1000M` → `1G`, `.5Gi` → `512Mi`,
//! `5n` → `1m`), with apimachinery's quirks kept, because a client compares
//! against what a cluster would answer:
//!
//! - a string its parser's fast path already considers canonical is kept
//!   verbatim (`+1Ki`, `01G`, `1.500G`, `1.5e-5` come back unchanged);
//! - a binary size that is not a whole number of bytes, or is below
//!   1024, is printed in decimal (`1.5Ki` → `1536`, `100.035Ki` →
//!   `102435840m`);
//! - values are rounded up to a multiple of 10⁻⁹; binary ones are capped at
//!   2⁶³−1;
//! - a decimal exponent with no SI suffix is printed without one
//!   (`1000E` → `1`).
//!
//! Re-implemented from the algorithm of `k8s.io/apimachinery`
//! `pkg/api/resource` (`ParseQuantity`, `CanonicalizeBytes`) with exact
//! decimal arithmetic (digit strings, no floating point), and checked
//! against it (see the tests).

use std::cmp::Ordering;
use std::fmt;

/// How a quantity is printed: the family of its suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `12e6`.
    DecimalExponent,
    /// `12Mi` (powers of 1024).
    BinarySI,
    /// `12M` (powers of 1000).
    DecimalSI,
}

/// A parsed quantity: its exact value, its format, and the input when
/// apimachinery would keep it as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity {
    value: Decimal,
    format: Format,
    verbatim: Option<String>,
    /// The scale of apimachinery's int64 form, when the fast path made it.
    int_scale: Option<i32>,
}

/// Whether `s` parses as a Kubernetes quantity with a value above zero.
pub fn is_positive(s: &str) -> bool {
    Quantity::parse(s).is_some_and(|q| q.sign() == Ordering::Greater)
}

/// Whether `s` is a syntactically valid quantity (any sign).
pub fn is_valid(s: &str) -> bool {
    Quantity::parse(s).is_some()
}

/// The form the Kubernetes API server stores the size `s` in (a PVC's
/// `resources.requests.storage`): `ParseQuantity`, the defaulting of every
/// resource list (rounded up to a multiple of 10⁻³), then `String()`.
/// `None` when `s` is not a quantity.
pub fn canonical(s: &str) -> Option<String> {
    Quantity::parse(s).map(|mut q| {
        q.round_up_milli();
        q.to_string()
    })
}

/// Canonical form of a size on its way out; what is not a quantity (e.g.
/// `""` of a warm pool) is passed through.
pub fn canonical_or_same(s: &str) -> String {
    canonical(s).unwrap_or_else(|| s.to_owned())
}

impl Quantity {
    /// `ParseQuantity`: `None` for what apimachinery rejects.
    pub fn parse(s: &str) -> Option<Self> {
        if s.is_empty() {
            return None;
        }
        if s == "0" {
            return Some(Self {
                value: Decimal::zero(),
                format: Format::DecimalSI,
                verbatim: Some(s.to_owned()),
                int_scale: Some(0),
            });
        }
        let parts = Parts::scan(s)?;
        let (base, exponent, format) = interpret(parts.suffix)?;
        if let Some(q) = fast_path(s, &parts, exponent, format) {
            return Some(q);
        }
        slow_path(&parts, base, exponent, format)
    }

    /// The sign of the value.
    pub fn sign(&self) -> Ordering {
        self.value.sign()
    }

    /// The format the quantity is printed in before canonical adjustments.
    pub fn format(&self) -> Format {
        self.format
    }

    /// `RoundUp(Milli)`, which the API server's defaulting applies to every
    /// resource list: rounds the magnitude up to a multiple of 10⁻³. An
    /// int64 form already that coarse keeps its verbatim text.
    pub fn round_up_milli(&mut self) {
        if self.int_scale.is_some_and(|scale| scale >= -3) {
            return;
        }
        self.verbatim = None;
        if self.int_scale.is_some() {
            self.int_scale = Some(-3);
        }
        self.value.round_up_to_exp(-3);
    }

    /// `CanonicalizeBytes`: the canonical text, ignoring the verbatim input.
    fn canonicalize(&self) -> String {
        let v = &self.value;
        if v.is_zero() {
            return "0".to_owned();
        }
        let mut format = self.format;
        let mut binary = None;
        if format == Format::BinarySI {
            // Below 1024 in magnitude, or not a whole number: decimal.
            if v.cmp_abs_int(1024) == Ordering::Less {
                format = Format::DecimalSI;
            } else {
                match v.ceil_abs_int() {
                    (n, true) => binary = Some(n),
                    (_, false) => format = Format::DecimalSI,
                }
            }
        }
        let sign = if v.negative { "-" } else { "" };
        if let Some(mut n) = binary {
            let mut times = 0;
            while n >= 1024 && n % 1024 == 0 {
                n /= 1024;
                times += 1;
            }
            let suffix = match times {
                1 => "Ki",
                2 => "Mi",
                3 => "Gi",
                4 => "Ti",
                5 => "Pi",
                6 => "Ei",
                _ => "",
            };
            return format!("{sign}{n}{suffix}");
        }
        let (mantissa, exponent) = v.canonical_decimal();
        let suffix = match format {
            Format::DecimalExponent if exponent == 0 => String::new(),
            Format::DecimalExponent => format!("e{exponent}"),
            // An exponent with no SI suffix gets none at all (as upstream).
            _ => decimal_suffix(exponent).unwrap_or("").to_owned(),
        };
        format!("{sign}{mantissa}{suffix}")
    }
}

impl fmt::Display for Quantity {
    /// `Quantity.String()`: what the API server stores and answers.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.verbatim {
            Some(s) => f.write_str(s),
            None => f.write_str(&self.canonicalize()),
        }
    }
}

/// The pieces of a quantity string (`parseQuantityString`).
struct Parts<'a> {
    positive: bool,
    /// Sign, digits and fraction, as written (`-01.50`).
    value: &'a str,
    /// Integer digits without leading zeros; `"0"` when none.
    num: &'a str,
    /// Fraction digits.
    denom: &'a str,
    suffix: &'a str,
}

impl<'a> Parts<'a> {
    fn scan(s: &'a str) -> Option<Self> {
        let b = s.as_bytes();
        let end = b.len();
        let mut pos = 0;
        let mut positive = true;
        match b.first() {
            Some(b'-') => {
                positive = false;
                pos = 1;
            }
            Some(b'+') => pos = 1,
            _ => {}
        }
        while pos < end && b[pos] == b'0' {
            pos += 1;
        }
        if pos >= end {
            return Some(Parts {
                positive,
                value: "0",
                num: "0",
                denom: "",
                suffix: "",
            });
        }
        let num_start = pos;
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        let num = if pos == num_start {
            "0"
        } else {
            &s[num_start..pos]
        };
        if pos >= end {
            return Some(Parts {
                positive,
                value: s,
                num,
                denom: "",
                suffix: "",
            });
        }
        let mut denom = "";
        if b[pos] == b'.' {
            pos += 1;
            let start = pos;
            while pos < end && b[pos].is_ascii_digit() {
                pos += 1;
            }
            denom = &s[start..pos];
            if pos >= end {
                return Some(Parts {
                    positive,
                    value: s,
                    num,
                    denom,
                    suffix: "",
                });
            }
        }
        let value = &s[..pos];
        let suffix_start = pos;
        while pos < end && b"eEinumkKMGTP".contains(&b[pos]) {
            pos += 1;
        }
        if pos < end && (b[pos] == b'-' || b[pos] == b'+') {
            pos += 1;
        }
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        if pos < end {
            // Something after the exponent digits.
            return None;
        }
        Some(Parts {
            positive,
            value,
            num,
            denom,
            suffix: &s[suffix_start..],
        })
    }
}

/// Base, exponent and format of a suffix.
fn interpret(suffix: &str) -> Option<(u32, i32, Format)> {
    let decimal = |e| Some((10, e, Format::DecimalSI));
    let binary = |e| Some((2, e, Format::BinarySI));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let exp = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .filter(|e| !e.is_empty())?;
            // Go's `int32(strconv.ParseInt(exp, 10, 64))`: wraps.
            let parsed: i64 = exp.parse().ok()?;
            Some((10, parsed as i32, Format::DecimalExponent))
        }
    }
}

fn decimal_suffix(exponent: i32) -> Option<&'static str> {
    Some(match exponent {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        _ => return None,
    })
}

/// apimachinery's int64 fast path; `None` when it hands over to the exact
/// (slow) path. Only here is the input kept verbatim.
fn fast_path(s: &str, p: &Parts, exponent: i32, format: Format) -> Option<Quantity> {
    let digits = (p.num.len() + p.denom.len()) as i32;
    let (mut scale, precision, multiplier) = match format {
        Format::DecimalExponent | Format::DecimalSI => (exponent, 18 - digits, 1i64),
        Format::BinarySI if exponent >= 0 && p.denom.is_empty() => {
            let approx = (exponent as f32 * 3.0 / 10.0) as i32;
            (0, 15 - p.num.len() as i32 - approx - 1, 1i64 << exponent)
        }
        Format::BinarySI => (0, -1, 1),
    };
    if precision < 0 {
        return None;
    }
    scale = scale.wrapping_sub(p.denom.len() as i32);
    if scale < -9 {
        return None;
    }
    let shifted = format!("{}{}", p.num, p.denom);
    let value: i64 = shifted.parse().ok()?;
    let mut result = value.checked_mul(multiplier)?;
    if !p.positive {
        result = -result;
    }
    let canonical_already = match format {
        Format::BinarySI => exponent % 10 == 0 && value & 0x07 != 0,
        _ => scale % 3 == 0 && !shifted.ends_with("000") && !shifted.starts_with('0'),
    };
    Some(Quantity {
        value: Decimal::from_i64(result, i64::from(scale)),
        format,
        verbatim: canonical_already.then(|| s.to_owned()),
        int_scale: Some(scale),
    })
}

/// The exact path: arbitrary digits, rounded up to 10⁻⁹, binary values
/// capped at 2⁶³−1.
fn slow_path(p: &Parts, base: u32, exponent: i32, mut format: Format) -> Option<Quantity> {
    let mut value = Decimal::parse_plain(p.value)?;
    if base == 10 {
        value.exp += i64::from(exponent);
    } else {
        value.mul_small(1u64 << exponent);
    }
    let negative = value.negative;
    value.negative = false;
    if !value.is_zero() {
        value.round_up_to_exp(-9);
    }
    if format == Format::BinarySI && value.cmp_abs_int(i64::MAX as u128) == Ordering::Greater {
        value = Decimal::from_i64(i64::MAX, 0);
    }
    if format == Format::BinarySI && !value.is_zero() && value.cmp_abs_int(1) == Ordering::Less {
        format = Format::DecimalSI;
    }
    value.negative = negative && !value.is_zero();
    Some(Quantity {
        value,
        format,
        verbatim: None,
        int_scale: None,
    })
}

/// An exact decimal: `digits × 10^exp`, digits without leading zeros
/// (none at all for zero).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: Vec<u8>,
    exp: i64,
}

impl Decimal {
    fn zero() -> Self {
        Self {
            negative: false,
            digits: Vec::new(),
            exp: 0,
        }
    }

    fn from_i64(value: i64, exp: i64) -> Self {
        let mut d = Self {
            negative: value < 0,
            digits: value.unsigned_abs().to_string().into_bytes(),
            exp,
        };
        d.normalize();
        d
    }

    /// `[+-]digits[.digits]` with at least one digit (what `inf.Dec`
    /// accepts from the quantity parser).
    fn parse_plain(s: &str) -> Option<Self> {
        let (negative, rest) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let (int, frac) = rest.split_once('.').unwrap_or((rest, ""));
        if int.len() + frac.len() == 0
            || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let mut d = Self {
            negative,
            digits: int.bytes().chain(frac.bytes()).collect(),
            exp: -(frac.len() as i64),
        };
        d.normalize();
        Some(d)
    }

    fn normalize(&mut self) {
        let lead = self.digits.iter().take_while(|&&d| d == b'0').count();
        self.digits.drain(..lead);
        if self.digits.is_empty() {
            self.negative = false;
            self.exp = 0;
        }
    }

    fn is_zero(&self) -> bool {
        self.digits.is_empty()
    }

    fn sign(&self) -> Ordering {
        match (self.is_zero(), self.negative) {
            (true, _) => Ordering::Equal,
            (false, true) => Ordering::Less,
            (false, false) => Ordering::Greater,
        }
    }

    /// Multiplies the magnitude by `m`.
    fn mul_small(&mut self, m: u64) {
        let mut carry: u128 = 0;
        for d in self.digits.iter_mut().rev() {
            let v = u128::from(*d - b'0') * u128::from(m) + carry;
            *d = b'0' + (v % 10) as u8;
            carry = v / 10;
        }
        let mut head = Vec::new();
        while carry > 0 {
            head.push(b'0' + (carry % 10) as u8);
            carry /= 10;
        }
        head.reverse();
        head.append(&mut self.digits);
        self.digits = head;
        self.normalize();
    }

    /// Rounds the magnitude up (away from zero) to a multiple of `10^exp`.
    fn round_up_to_exp(&mut self, exp: i64) {
        if self.exp >= exp {
            return;
        }
        let drop = (exp - self.exp) as u128;
        let len = self.digits.len() as u128;
        let keep = len.saturating_sub(drop) as usize;
        let inexact = self.digits[keep..].iter().any(|&d| d != b'0');
        self.digits.truncate(keep);
        self.exp = exp;
        if inexact {
            // Increment the kept digits.
            let mut i = self.digits.len();
            loop {
                if i == 0 {
                    self.digits.insert(0, b'1');
                    break;
                }
                i -= 1;
                if self.digits[i] == b'9' {
                    self.digits[i] = b'0';
                } else {
                    self.digits[i] += 1;
                    break;
                }
            }
        }
        self.normalize();
        if !self.is_zero() {
            self.exp = exp;
        }
    }

    /// The integer part of the magnitude, whether a fraction remains, or
    /// `None` when the integer part exceeds `u128`.
    fn split_abs(&self) -> Option<(u128, bool)> {
        let int_len = self.digits.len() as i64 + self.exp;
        if int_len > 39 {
            return None;
        }
        let mut n: u128 = 0;
        let mut fraction = false;
        for (i, &d) in self.digits.iter().enumerate() {
            if (i as i64) < int_len {
                n = n.checked_mul(10)?.checked_add(u128::from(d - b'0'))?;
            } else if d != b'0' {
                fraction = true;
            }
        }
        for _ in 0..self.exp.max(0) {
            n = n.checked_mul(10)?;
        }
        Some((n, fraction))
    }

    /// Compares the magnitude with the integer `n`.
    fn cmp_abs_int(&self, n: u128) -> Ordering {
        match self.split_abs() {
            None => Ordering::Greater,
            Some((int, fraction)) => int.cmp(&n).then(if fraction {
                Ordering::Greater
            } else {
                Ordering::Equal
            }),
        }
    }

    /// The magnitude rounded up to an integer, and whether that was exact.
    /// Only used for binary quantities, which are at most 2⁶³−1.
    fn ceil_abs_int(&self) -> (u128, bool) {
        match self.split_abs() {
            Some((int, fraction)) => (int + u128::from(fraction), !fraction),
            None => (u128::MAX, false),
        }
    }

    /// `AsCanonicalBytes`: the magnitude's digits without trailing zeros,
    /// padded so that the exponent is a multiple of 3 (rounded down).
    fn canonical_decimal(&self) -> (String, i32) {
        let trailing = self.digits.iter().rev().take_while(|&&d| d == b'0').count();
        let mut digits = self.digits[..self.digits.len() - trailing].to_vec();
        // Go keeps the exponent in an int32.
        let mut exponent = (self.exp + trailing as i64) as i32;
        while exponent % 3 != 0 {
            digits.push(b'0');
            exponent = exponent.wrapping_sub(1);
        }
        (String::from_utf8(digits).unwrap_or_default(), exponent)
    }
}

#[cfg(test)]
mod tests;
