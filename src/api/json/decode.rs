//! Decodes one JSON object into a Go-like struct description, with the
//! semantics and messages of Go's `encoding/json` (`Decoder` with
//! `DisallowUnknownFields`):
//!
//! - keys match a field exactly or case-insensitively (Go's folding: `K`
//!   KELVIN SIGN matches `k`, `ſ` matches `s`); with duplicate keys
//!   the last one wins, and objects decode into the same struct (merge);
//! - `null` leaves a field as it is (a `*bool` becomes absent);
//! - type errors name Go's types (`json: cannot unmarshal number into Go
//!   struct field Workspace.workspace.size of type string`), and an `int`
//!   that does not parse names its literal (`number 1e20`);
//! - the first problem in document order is reported, whether a type
//!   error or an unknown field; values of unknown fields and values of the
//!   wrong type are skipped unexamined;
//! - strings are unquoted like Go: invalid UTF-8 and lone surrogates become
//!   U+FFFD.
//!
//! The input is a value [`super::scan::first_value`] has accepted, so it is
//! known to be well-formed JSON.

use super::quote::go_quote;

/// A Go struct type, as far as decoding needs it.
#[derive(Debug)]
pub struct GoStruct {
    /// Qualified type name, e.g. `pool.CreateRequest`.
    pub go_type: &'static str,
    /// Its JSON fields.
    pub fields: &'static [GoField],
}

impl GoStruct {
    /// The unqualified name, e.g. `CreateRequest`.
    fn name(&self) -> &'static str {
        self.go_type
            .rsplit_once('.')
            .map_or(self.go_type, |(_, n)| n)
    }
}

/// One field of a [`GoStruct`].
#[derive(Debug)]
pub struct GoField {
    /// The JSON name (the struct tag).
    pub json: &'static str,
    /// The Go type.
    pub kind: GoKind,
}

/// The Go types fields have.
#[derive(Debug)]
pub enum GoKind {
    /// `string`.
    String,
    /// `int` (64 bits).
    Int,
    /// `*bool`: absent, `true` or `false`.
    BoolPtr,
    /// A nested struct (a value, not a pointer).
    Struct(&'static GoStruct),
}

impl GoKind {
    fn type_name(&self) -> &'static str {
        match self {
            GoKind::String => "string",
            GoKind::Int => "int",
            GoKind::BoolPtr => "bool",
            GoKind::Struct(s) => s.go_type,
        }
    }
}

/// The struct a missing nested field reads as.
static EMPTY: GoStruct = GoStruct {
    go_type: "",
    fields: &[],
};

/// A decoded field value.
#[derive(Debug, Clone)]
enum Slot {
    Str(String),
    Int(i64),
    Bool(Option<bool>),
    Struct(Decoded),
}

impl Slot {
    fn zero(kind: &GoKind) -> Self {
        match kind {
            GoKind::String => Slot::Str(String::new()),
            GoKind::Int => Slot::Int(0),
            GoKind::BoolPtr => Slot::Bool(None),
            GoKind::Struct(s) => Slot::Struct(Decoded::zero(s)),
        }
    }
}

/// A decoded struct: every field, at its zero value unless set.
#[derive(Debug, Clone)]
pub struct Decoded {
    schema: &'static GoStruct,
    slots: Vec<Slot>,
}

impl Decoded {
    fn zero(schema: &'static GoStruct) -> Self {
        Self {
            schema,
            slots: schema.fields.iter().map(|f| Slot::zero(&f.kind)).collect(),
        }
    }

    /// The slot of field `json`. The schemas are static and the callers
    /// name their fields; a wrong name is a bug, caught in debug builds
    /// (release builds read the zero value rather than failing a request).
    fn slot(&self, json: &str) -> Option<&Slot> {
        let slot = self
            .schema
            .fields
            .iter()
            .position(|f| f.json == json)
            .map(|i| &self.slots[i]);
        debug_assert!(
            slot.is_some(),
            "{} has no field {json}",
            self.schema.go_type
        );
        slot
    }

    /// A `string` field (`""` when unset).
    pub fn string(&self, json: &str) -> String {
        match self.slot(json) {
            Some(Slot::Str(s)) => s.clone(),
            _ => String::new(),
        }
    }

    /// An `int` field (`0` when unset).
    pub fn int(&self, json: &str) -> i64 {
        match self.slot(json) {
            Some(Slot::Int(n)) => *n,
            _ => 0,
        }
    }

    /// A `*bool` field.
    pub fn opt_bool(&self, json: &str) -> Option<bool> {
        match self.slot(json) {
            Some(Slot::Bool(b)) => *b,
            _ => None,
        }
    }

    /// A nested struct field (all zero when unset).
    pub fn nested(&self, json: &str) -> Decoded {
        match self.slot(json) {
            Some(Slot::Struct(d)) => d.clone(),
            _ => Decoded::zero(&EMPTY),
        }
    }

    /// Every field as JSON (zero values included), for comparing with Go.
    #[cfg(test)]
    pub fn to_value(&self) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        for (field, slot) in self.schema.fields.iter().zip(&self.slots) {
            let value = match slot {
                Slot::Str(s) => serde_json::Value::from(s.clone()),
                Slot::Int(n) => serde_json::Value::from(*n),
                Slot::Bool(b) => serde_json::json!(b),
                Slot::Struct(d) => d.to_value(),
            };
            map.insert(field.json.to_owned(), value);
        }
        serde_json::Value::Object(map)
    }
}

/// Decodes `value` (one well-formed JSON value) into `schema`; `Err` is
/// Go's message for the first problem.
pub fn decode(value: &[u8], schema: &'static GoStruct) -> Result<Decoded, String> {
    let mut slot = Slot::Struct(Decoded::zero(schema));
    let mut walk = Walk {
        b: value,
        i: 0,
        error: None,
        fields: Vec::new(),
        structs: Vec::new(),
    };
    walk.value(&mut slot, &GoKind::Struct(schema));
    match (walk.error, slot) {
        (Some(e), _) => Err(e),
        (None, Slot::Struct(d)) => Ok(d),
        (None, other) => Err(format!("decoded {other:?}")),
    }
}

/// A cursor over well-formed JSON and the decoder's error context.
struct Walk<'a> {
    b: &'a [u8],
    i: usize,
    /// The first problem (Go's `savedError`).
    error: Option<String>,
    /// JSON names of the fields being decoded (Go's `FieldStack`).
    fields: Vec<&'static str>,
    /// The structs those fields belong to.
    structs: Vec<&'static GoStruct>,
}

impl Walk<'_> {
    fn skip_space(&mut self) {
        while self
            .b
            .get(self.i)
            .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\r' | b'\n'))
        {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> u8 {
        self.skip_space();
        self.b.get(self.i).copied().unwrap_or(b' ')
    }

    /// Records `err` unless an earlier problem was recorded.
    fn save(&mut self, err: String) {
        if self.error.is_none() {
            self.error = Some(err);
        }
    }

    fn type_error(&mut self, what: &str, kind: &GoKind) {
        let message = match self.structs.last() {
            Some(s) => format!(
                "json: cannot unmarshal {what} into Go struct field {}.{} of type {}",
                s.name(),
                self.fields.join("."),
                kind.type_name()
            ),
            None => format!(
                "json: cannot unmarshal {what} into Go value of type {}",
                kind.type_name()
            ),
        };
        self.save(message);
    }

    /// Decodes the value at the cursor into `slot` of type `kind`.
    fn value(&mut self, slot: &mut Slot, kind: &GoKind) {
        match self.peek() {
            b'{' => match slot {
                Slot::Struct(d) => self.object(d),
                _ => {
                    self.type_error("object", kind);
                    self.skip_value();
                }
            },
            b'[' => {
                self.type_error("array", kind);
                self.skip_value();
            }
            b'"' => {
                let s = self.string();
                match slot {
                    Slot::Str(v) => *v = s,
                    _ => self.type_error("string", kind),
                }
            }
            b't' | b'f' => {
                let v = self.literal() == b"true";
                match slot {
                    Slot::Bool(b) => *b = Some(v),
                    _ => self.type_error("bool", kind),
                }
            }
            b'n' => {
                self.literal();
                // Only pointers (and maps, slices, interfaces) are reset.
                if let Slot::Bool(b) = slot {
                    *b = None;
                }
            }
            _ => {
                let literal = String::from_utf8_lossy(self.literal()).into_owned();
                match slot {
                    Slot::Int(n) => match literal.parse::<i64>() {
                        Ok(v) => *n = v,
                        Err(_) => self.type_error(&format!("number {literal}"), kind),
                    },
                    _ => self.type_error("number", kind),
                }
            }
        }
    }

    fn object(&mut self, target: &mut Decoded) {
        self.i += 1; // '{'
        loop {
            if self.peek() == b'}' {
                self.i += 1;
                return;
            }
            let key = self.string();
            self.peek();
            self.i += 1; // ':'
            match find_field(target.schema, &key) {
                Some(index) => {
                    let field = &target.schema.fields[index];
                    self.fields.push(field.json);
                    self.structs.push(target.schema);
                    self.value(&mut target.slots[index], &field.kind);
                    self.fields.pop();
                    self.structs.pop();
                }
                None => {
                    self.save(format!("json: unknown field {}", go_quote(&key)));
                    self.skip_value();
                }
            }
            if self.peek() == b',' {
                self.i += 1;
            }
        }
    }

    /// The bytes of a number or of `true`/`false`/`null`.
    fn literal(&mut self) -> &[u8] {
        self.skip_space();
        let start = self.i;
        while self
            .b
            .get(self.i)
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.'))
        {
            self.i += 1;
        }
        &self.b[start..self.i]
    }

    /// Skips one value (iteratively: nesting depth is not bounded here).
    fn skip_value(&mut self) {
        let mut depth = 0usize;
        loop {
            match self.peek() {
                b'{' | b'[' => {
                    depth += 1;
                    self.i += 1;
                }
                b'}' | b']' => {
                    depth = depth.saturating_sub(1);
                    self.i += 1;
                }
                b'"' => self.skip_string(),
                b',' | b':' => self.i += 1,
                _ => {
                    self.literal();
                }
            }
            if depth == 0 || self.i >= self.b.len() {
                return;
            }
        }
    }

    fn skip_string(&mut self) {
        self.i += 1;
        while let Some(&c) = self.b.get(self.i) {
            self.i += 1;
            match c {
                b'\\' => self.i += 1,
                b'"' => return,
                _ => {}
            }
        }
    }

    /// Unquotes the string at the cursor as Go does.
    fn string(&mut self) -> String {
        self.skip_space();
        let start = self.i + 1;
        self.skip_string();
        let raw = &self.b[start..self.i.saturating_sub(1).max(start)];
        unquote(raw)
    }
}

/// Go's `unquoteBytes` of a string body (between the quotes).
fn unquote(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'\\' => {
                let e = raw.get(i + 1).copied().unwrap_or(b'\\');
                i += 2;
                match e {
                    b'b' => out.push('\u{8}'),
                    b'f' => out.push('\u{c}'),
                    b'n' => out.push('\n'),
                    b'r' => out.push('\r'),
                    b't' => out.push('\t'),
                    b'u' => {
                        let Some(first) = hex4(&raw[i..]) else {
                            out.push(char::REPLACEMENT_CHARACTER);
                            continue;
                        };
                        i += 4;
                        if (0xd800..0xe000).contains(&first) {
                            // A surrogate: only a high one followed by an
                            // escaped low one makes a character.
                            let pair = raw
                                .get(i..i + 2)
                                .filter(|p| p == b"\\u")
                                .and_then(|_| hex4(&raw[i + 2..]))
                                .filter(|&low| {
                                    (0xd800..0xdc00).contains(&first)
                                        && (0xdc00..0xe000).contains(&low)
                                });
                            match pair {
                                Some(low) => {
                                    let c = 0x10000 + ((first - 0xd800) << 10) + (low - 0xdc00);
                                    out.push(char::from_u32(c).unwrap_or('\u{fffd}'));
                                    i += 6;
                                }
                                None => out.push(char::REPLACEMENT_CHARACTER),
                            }
                        } else {
                            out.push(char::from_u32(first).unwrap_or('\u{fffd}'));
                        }
                    }
                    other => out.push(char::from(other)),
                }
            }
            _ => {
                // A run of raw bytes: valid UTF-8 is kept, each invalid
                // byte becomes U+FFFD (as Go's utf8.DecodeRune sees it).
                let end = raw[i..]
                    .iter()
                    .position(|&c| c == b'\\')
                    .map_or(raw.len(), |p| i + p);
                let mut run = &raw[i..end];
                while !run.is_empty() {
                    match std::str::from_utf8(run) {
                        Ok(s) => {
                            out.push_str(s);
                            run = &[];
                        }
                        Err(e) => {
                            let valid = e.valid_up_to();
                            out.push_str(std::str::from_utf8(&run[..valid]).unwrap_or(""));
                            out.push(char::REPLACEMENT_CHARACTER);
                            run = &run[valid + 1..];
                        }
                    }
                }
                i = end;
            }
        }
    }
    out
}

fn hex4(b: &[u8]) -> Option<u32> {
    let digits = std::str::from_utf8(b.get(..4)?).ok()?;
    u32::from_str_radix(digits, 16).ok()
}

/// The field `key` names: an exact match first, else Go's case folding.
fn find_field(schema: &GoStruct, key: &str) -> Option<usize> {
    if let Some(i) = schema.fields.iter().position(|f| f.json == key) {
        return Some(i);
    }
    let folded = fold(key);
    schema.fields.iter().position(|f| fold(f.json) == folded)
}

/// Go's key folding (simple case folding): ASCII letters upper-cased; of
/// the other characters only KELVIN SIGN and LONG S fold onto ASCII
/// letters (`İ` and `ı` do not: checked against Go).
fn fold(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\u{212a}' => 'K',
            '\u{17f}' => 'S',
            _ => c.to_ascii_uppercase(),
        })
        .collect()
}
