//! Finds the first JSON value of a body exactly as Go's `json.Decoder`
//! does, with Go's syntax-error messages (`invalid character 'x' looking
//! for beginning of value`, `unexpected EOF`, ...).
//!
//! A byte-at-a-time state machine with an explicit nesting stack, the
//! design of Go's `encoding/json` scanner (re-implemented, not copied), so
//! a deeply nested body cannot exhaust the stack.

/// Go's `maxNestingDepth`.
const MAX_DEPTH: usize = 10_000;

/// What the decoder reports when the first value cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanError {
    /// A syntax error, with Go's message.
    Syntax(String),
    /// The body ended inside the value (`unexpected EOF`) or before it
    /// (`EOF`).
    Eof(&'static str),
}

impl ScanError {
    /// The message Go's decoder returns.
    pub fn message(&self) -> &str {
        match self {
            ScanError::Syntax(m) => m,
            ScanError::Eof(m) => m,
        }
    }
}

/// The end offset of the first JSON value in `buf` (trailing bytes are
/// ignored, as Go's `Decoder.Decode` ignores them), or why there is none.
/// `Ok(None)`: the value has not ended within `buf` and more input may
/// follow (the caller had to stop reading).
pub fn first_value(buf: &[u8], complete: bool) -> Result<Option<usize>, ScanError> {
    let mut scanner = Scanner::new();
    for (i, &c) in buf.iter().enumerate() {
        match scanner.step(c) {
            Op::Continue => {}
            // The byte that ended a scalar is not part of it.
            Op::End => return Ok(Some(i)),
            Op::EndComposite if scanner.stack.is_empty() => return Ok(Some(i + 1)),
            Op::EndComposite => {}
            Op::Error(message) => return Err(ScanError::Syntax(message)),
        }
    }
    if !complete {
        return Ok(None);
    }
    // At EOF Go feeds one space: it ends a trailing top-level number.
    if matches!(scanner.step(b' '), Op::End) {
        return Ok(Some(buf.len()));
    }
    if buf.iter().any(|&b| !is_space(b)) {
        Err(ScanError::Eof("unexpected EOF"))
    } else {
        Err(ScanError::Eof("EOF"))
    }
}

/// What one byte did.
enum Op {
    Continue,
    /// The top-level value ended before this byte.
    End,
    /// An object or array closed with this byte.
    EndComposite,
    Error(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    ObjectKey,
    ObjectValue,
    ArrayValue,
}

#[derive(Debug, Clone, Copy)]
enum State {
    BeginValue,
    BeginValueOrEmpty,
    BeginStringOrEmpty,
    BeginString,
    EndValue,
    EndTop,
    InString,
    InStringEsc,
    /// Inside `\u`, with this many hex digits seen.
    InStringEscU(u8),
    Neg,
    One,
    Zero,
    Dot,
    Dot0,
    E,
    ESign,
    E0,
    /// Inside `true`, `false` or `null`, expecting `word[at]`.
    Literal(&'static str, usize),
}

struct Scanner {
    state: State,
    stack: Vec<Frame>,
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

impl Scanner {
    fn new() -> Self {
        Self {
            state: State::BeginValue,
            stack: Vec::new(),
        }
    }

    fn error(c: u8, context: &str) -> Op {
        Op::Error(format!("invalid character {} {context}", quote_char(c)))
    }

    fn push(&mut self, c: u8, frame: Frame, next: State) -> Op {
        self.stack.push(frame);
        if self.stack.len() > MAX_DEPTH {
            return Self::error(c, "exceeded max depth");
        }
        self.state = next;
        Op::Continue
    }

    fn pop(&mut self) -> Op {
        self.stack.pop();
        self.state = if self.stack.is_empty() {
            State::EndTop
        } else {
            State::EndValue
        };
        Op::EndComposite
    }

    fn step(&mut self, c: u8) -> Op {
        match self.state {
            State::BeginValueOrEmpty => {
                if is_space(c) {
                    return Op::Continue;
                }
                if c == b']' {
                    return self.end_value(c);
                }
                self.begin_value(c)
            }
            State::BeginValue => self.begin_value(c),
            State::BeginStringOrEmpty => {
                if is_space(c) {
                    return Op::Continue;
                }
                if c == b'}' {
                    if let Some(top) = self.stack.last_mut() {
                        *top = Frame::ObjectValue;
                    }
                    return self.end_value(c);
                }
                self.begin_string(c)
            }
            State::BeginString => self.begin_string(c),
            State::EndValue => self.end_value(c),
            State::EndTop => Op::End,
            State::InString => {
                match c {
                    b'"' => self.state = State::EndValue,
                    b'\\' => self.state = State::InStringEsc,
                    _ if c < 0x20 => return Self::error(c, "in string literal"),
                    _ => {}
                }
                Op::Continue
            }
            State::InStringEsc => match c {
                b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {
                    self.state = State::InString;
                    Op::Continue
                }
                b'u' => {
                    self.state = State::InStringEscU(0);
                    Op::Continue
                }
                _ => Self::error(c, "in string escape code"),
            },
            State::InStringEscU(n) => {
                if !c.is_ascii_hexdigit() {
                    return Self::error(c, "in \\u hexadecimal character escape");
                }
                self.state = if n == 3 {
                    State::InString
                } else {
                    State::InStringEscU(n + 1)
                };
                Op::Continue
            }
            State::Neg => match c {
                b'0' => {
                    self.state = State::Zero;
                    Op::Continue
                }
                b'1'..=b'9' => {
                    self.state = State::One;
                    Op::Continue
                }
                _ => Self::error(c, "in numeric literal"),
            },
            State::One => {
                if c.is_ascii_digit() {
                    return Op::Continue;
                }
                self.after_zero(c)
            }
            State::Zero => self.after_zero(c),
            State::Dot => {
                if c.is_ascii_digit() {
                    self.state = State::Dot0;
                    return Op::Continue;
                }
                Self::error(c, "after decimal point in numeric literal")
            }
            State::Dot0 => match c {
                b'0'..=b'9' => Op::Continue,
                b'e' | b'E' => {
                    self.state = State::E;
                    Op::Continue
                }
                _ => self.end_value(c),
            },
            State::E => {
                if c == b'+' || c == b'-' {
                    self.state = State::ESign;
                    return Op::Continue;
                }
                self.e_sign(c)
            }
            State::ESign => self.e_sign(c),
            State::E0 => {
                if c.is_ascii_digit() {
                    return Op::Continue;
                }
                self.end_value(c)
            }
            State::Literal(word, at) => {
                let want = word.as_bytes()[at];
                if c != want {
                    return Self::error(
                        c,
                        &format!("in literal {word} (expecting {})", quote_char(want)),
                    );
                }
                self.state = if at + 1 == word.len() {
                    State::EndValue
                } else {
                    State::Literal(word, at + 1)
                };
                Op::Continue
            }
        }
    }

    fn begin_value(&mut self, c: u8) -> Op {
        if is_space(c) {
            return Op::Continue;
        }
        let next = match c {
            b'{' => return self.push(c, Frame::ObjectKey, State::BeginStringOrEmpty),
            b'[' => return self.push(c, Frame::ArrayValue, State::BeginValueOrEmpty),
            b'"' => State::InString,
            b'-' => State::Neg,
            b'0' => State::Zero,
            b't' => State::Literal("true", 1),
            b'f' => State::Literal("false", 1),
            b'n' => State::Literal("null", 1),
            b'1'..=b'9' => State::One,
            _ => return Self::error(c, "looking for beginning of value"),
        };
        self.state = next;
        Op::Continue
    }

    fn begin_string(&mut self, c: u8) -> Op {
        if is_space(c) {
            return Op::Continue;
        }
        if c == b'"' {
            self.state = State::InString;
            return Op::Continue;
        }
        Self::error(c, "looking for beginning of object key string")
    }

    fn after_zero(&mut self, c: u8) -> Op {
        match c {
            b'.' => {
                self.state = State::Dot;
                Op::Continue
            }
            b'e' | b'E' => {
                self.state = State::E;
                Op::Continue
            }
            _ => self.end_value(c),
        }
    }

    fn e_sign(&mut self, c: u8) -> Op {
        if c.is_ascii_digit() {
            self.state = State::E0;
            return Op::Continue;
        }
        Self::error(c, "in exponent of numeric literal")
    }

    fn end_value(&mut self, c: u8) -> Op {
        let Some(&frame) = self.stack.last() else {
            // A complete top-level value: whatever follows ends it.
            self.state = State::EndTop;
            return Op::End;
        };
        if is_space(c) {
            self.state = State::EndValue;
            return Op::Continue;
        }
        match frame {
            Frame::ObjectKey => {
                if c == b':' {
                    if let Some(top) = self.stack.last_mut() {
                        *top = Frame::ObjectValue;
                    }
                    self.state = State::BeginValue;
                    return Op::Continue;
                }
                Self::error(c, "after object key")
            }
            Frame::ObjectValue => match c {
                b',' => {
                    if let Some(top) = self.stack.last_mut() {
                        *top = Frame::ObjectKey;
                    }
                    self.state = State::BeginString;
                    Op::Continue
                }
                b'}' => self.pop(),
                _ => Self::error(c, "after object key:value pair"),
            },
            Frame::ArrayValue => match c {
                b',' => {
                    self.state = State::BeginValue;
                    Op::Continue
                }
                b']' => self.pop(),
                _ => Self::error(c, "after array element"),
            },
        }
    }
}

/// A byte as Go's scanner quotes it in messages: `'x'`, `'"'`, `'\''`,
/// `'\n'`, `'\x01'`, `'\u0085'`, `'é'` (a byte above 0x7f is shown as the
/// Latin-1 character of that code point).
pub fn quote_char(c: u8) -> String {
    match c {
        b'\'' => "'\\''".to_owned(),
        b'"' => "'\"'".to_owned(),
        _ => {
            let quoted = super::quote::go_quote(&char::from(c).to_string());
            format!("'{}'", &quoted[1..quoted.len() - 1])
        }
    }
}
