//! A push body, read in one pass.
//!
//! The body is checked to be UTF-8 once (by `ByteString`, the only check of
//! it that is not part of the scan), then scanned once from its first byte to
//! its last. The scan finds each item's fields, validates every value as a
//! full decode would (a payload's strings and keys have every escape naming a
//! character, its numbers fit a double, its nesting stays within serde_json's
//! limit), and keeps each field as a slice of the request's own buffer: a
//! queue, partition, transactionId or payload is a reference-counted view of
//! the body, not a copy. Only a name or id written with escapes, or a name
//! not in NFC, is decoded into a buffer of its own.
//!
//! It is written by hand because it must keep each payload's text and
//! validate it fully in the same scan, and reach exactly serde_json's
//! verdicts (the stepwise reading is the reference). serde_json can borrow
//! strings and capture a value's text (`RawValue`), but a captured value is
//! only checked for syntax, so a payload has to be scanned again to be
//! decoded: that is the stepwise reading, measured beside this one. simd-json
//! parses in place, so every body would need a mutable copy; and any other
//! parser's own rules for numbers and skipped values would have to be
//! reconciled with serde_json's. Where serde_json's rounding decides (a number
//! near the largest double), this reader asks serde_json. Its speed beside
//! serde_json's own syntax check of the same bytes is in
//! `bench/parse/RESULTS.md`.
//!
//! What it accepts is exactly what [`super::stepwise`] (serde_json, in steps)
//! accepts, and it finds the same items: `fuzz/fuzz_targets/parse_push_diff.rs`
//! holds them to it. A body it refuses is read again by [`super::stepwise`],
//! whose refusals are the API's words: each names the field, the item's
//! index, and serde_json's own account of bad JSON. A refusal costs a second
//! reading; an accepted body never does.

use std::borrow::Cow;

use bytes::Bytes;
use bytestring::ByteString;
use serde_json::value::RawValue;
use unicode_normalization::UnicodeNormalization as _;

use super::item::PushItem;
use super::stepwise;
use crate::api::{BadRequest, DEFAULT_PARTITION, MAX_NAME_BYTES, MAX_TRANSACTION_ID_BYTES, validate_name};
use crate::payload::{MAX_DEPTH, Payload};

/// Parses and validates a `POST /api/v1/push` body: `{"items": [...]}`.
pub fn parse_push(body: &Bytes, max_items: usize) -> Result<Vec<PushItem>, BadRequest> {
    let Ok(text) = ByteString::try_from(body.clone()) else {
        return named(stepwise::parse_push(body, max_items));
    };
    match read_push(&text, max_items) {
        Some(items) => Ok(items),
        None => named(stepwise::parse_push(body, max_items)),
    }
}

/// Parses a JSON array of push items, `items`, which is part of `body` and
/// starts with `[`. Errors name each field as `{at}items[3].queue`.
pub fn parse_items(at: &str, body: &ByteString, items: &RawValue, max_items: usize) -> Result<Vec<PushItem>, BadRequest> {
    match read_items(body, items, max_items) {
        Some(read) => Ok(read),
        None => named(stepwise::parse_items(at, items, max_items)),
    }
}

/// The one-pass reading of a push body: `None` when [`super::stepwise`]
/// refuses it.
pub fn read_push(body: &ByteString, max_items: usize) -> Option<Vec<PushItem>> {
    let mut reader = Reader::new(body, 0, body.len());
    let mut items = None;
    reader.whitespace();
    reader.expect(b'{')?;
    if !reader.close(b'}') {
        loop {
            let key = reader.key()?;
            if key.is(b"items") {
                if items.is_some() {
                    return None;
                }
                reader.whitespace();
                items = Some(reader.items(max_items)?);
            } else {
                reader.value(Check::Syntax)?;
            }
            if !reader.next_member(b'}')? {
                break;
            }
        }
    }
    reader.whitespace();
    reader.at_end()?;
    items
}

/// The one-pass reading of an items array inside `body`: `None` when
/// [`stepwise::parse_items`] refuses it.
pub fn read_items(body: &ByteString, items: &RawValue, max_items: usize) -> Option<Vec<PushItem>> {
    let items = items.get();
    let start = (items.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(items.len()).filter(|&end| end <= body.len())?;
    let mut reader = Reader::new(body, start, end);
    let read = reader.items(max_items)?;
    reader.at_end()?;
    Some(read)
}

/// The answer to a body the one-pass reader refused: the stepwise reading's
/// refusal. Both refuse the same bodies; should the stepwise reading accept
/// one all the same, its items are the answer, as they were before the
/// one-pass reader.
#[cold]
fn named(stepwise: Result<Vec<PushItem>, BadRequest>) -> Result<Vec<PushItem>, BadRequest> {
    debug_assert!(stepwise.is_err(), "the one-pass reader refused what the stepwise reading accepts");
    stepwise
}

/// How fully a value is checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// The syntax only, as serde_json checks a value it skips: a field the
    /// API ignores may hold a lone surrogate or a number no double holds.
    Syntax,
    /// Everything a full decode checks: every escape names a character (no
    /// lone surrogate), every number fits a double, nesting within
    /// serde_json's limit; and no string holds U+0000.
    Decode,
}

/// A cursor over `body[..end]`, valid UTF-8.
struct Reader<'a> {
    body: &'a ByteString,
    bytes: &'a [u8],
    pos: usize,
}

/// An object key, decoded: a view of the body unless it holds an escape.
struct Key<'a>(Cow<'a, [u8]>);

impl Key<'_> {
    fn is(&self, name: &[u8]) -> bool {
        *self.0 == *name
    }
}

/// Which field of an item a key names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Queue,
    Partition,
    TransactionId,
    Payload,
    Other,
}

impl<'a> Reader<'a> {
    fn new(body: &'a ByteString, start: usize, end: usize) -> Reader<'a> {
        Reader { body, bytes: &body.as_bytes()[..end], pos: start }
    }

    /// The body's text from `start` to here, as a view of the body.
    fn slice_from(&self, start: usize) -> ByteString {
        self.body.slice_ref(&self.body[start..self.pos])
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Some(())
        } else {
            None
        }
    }

    fn at_end(&self) -> Option<()> {
        (self.pos == self.bytes.len()).then_some(())
    }

    /// After an opening bracket: whether the container is empty (its closing
    /// bracket, `close`, is then consumed).
    fn close(&mut self, close: u8) -> bool {
        self.whitespace();
        self.expect(close).is_some()
    }

    /// After a member or element: `true` at a comma (consumed with the
    /// whitespace after it), `false` at `close` (consumed), `None` otherwise.
    fn next_member(&mut self, close: u8) -> Option<bool> {
        self.whitespace();
        match self.peek()? {
            b',' => {
                self.pos += 1;
                self.whitespace();
                Some(true)
            }
            byte if byte == close => {
                self.pos += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// An object key and the colon after it. Keys are decoded in full (a
    /// field's name is matched on its decoded text), so every escape in one
    /// must name a character.
    fn key(&mut self) -> Option<Key<'a>> {
        self.expect(b'"')?;
        let start = self.pos;
        let escaped = self.string(Check::Decode)?;
        let raw = &self.bytes[start..self.pos - 1];
        self.whitespace();
        self.expect(b':')?;
        self.whitespace();
        Some(Key(if escaped { Cow::Owned(unescape(raw).into_bytes()) } else { Cow::Borrowed(raw) }))
    }

    /// The rest of a string after its opening quote, through its closing
    /// quote: whether it holds an escape.
    fn string(&mut self, check: Check) -> Option<bool> {
        let mut escaped = false;
        loop {
            self.pos = next_special(self.bytes, self.pos);
            match self.peek()? {
                b'"' => {
                    self.pos += 1;
                    return Some(escaped);
                }
                b'\\' => {
                    self.pos += 1;
                    escaped = true;
                    self.escape(check)?;
                }
                // A control character, which JSON strings may not hold raw.
                _ => return None,
            }
        }
    }

    /// An escape after its backslash.
    fn escape(&mut self, check: Check) -> Option<()> {
        let byte = self.peek()?;
        self.pos += 1;
        match byte {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(()),
            b'u' => {
                let unit = self.hex4()?;
                if check == Check::Syntax {
                    return Some(());
                }
                match unit {
                    // U+0000, which PostgreSQL's jsonb (and text) cannot
                    // hold: a SQL reader's `payload::jsonb` would fail.
                    0 => None,
                    0xDC00..=0xDFFF => None,
                    0xD800..=0xDBFF => {
                        self.expect(b'\\')?;
                        self.expect(b'u')?;
                        matches!(self.hex4()?, 0xDC00..=0xDFFF).then_some(())
                    }
                    _ => Some(()),
                }
            }
            _ => None,
        }
    }

    fn hex4(&mut self) -> Option<u16> {
        let digits = self.bytes.get(self.pos..self.pos + 4)?;
        self.pos += 4;
        hex4(digits)
    }

    /// A value, checked as `check` says. Nesting is followed with a stack of
    /// its own rather than by recursion: a skipped value may nest as deep as
    /// the body is long.
    fn value(&mut self, check: Check) -> Option<()> {
        let mut open = Nesting::default();
        loop {
            // A value starts here.
            match self.peek()? {
                b'"' => {
                    self.pos += 1;
                    self.string(check)?;
                }
                b'-' | b'0'..=b'9' => self.number(check)?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                bracket @ (b'[' | b'{') => {
                    self.pos += 1;
                    if check == Check::Decode && open.depth() == MAX_DEPTH {
                        return None;
                    }
                    let object = bracket == b'{';
                    if !self.close(if object { b'}' } else { b']' }) {
                        open.push(object);
                        if object {
                            self.member_key(check)?;
                        }
                        continue;
                    }
                }
                _ => return None,
            }
            // A value ended: the next element or member, or the ends of the
            // containers it closes.
            loop {
                let Some(object) = open.top() else { return Some(()) };
                if self.next_member(if object { b'}' } else { b']' })? {
                    if object {
                        self.member_key(check)?;
                    }
                    break;
                }
                open.pop();
            }
        }
    }

    /// A key inside a value: checked as the value is.
    fn member_key(&mut self, check: Check) -> Option<()> {
        self.expect(b'"')?;
        self.string(check)?;
        self.whitespace();
        self.expect(b':')?;
        self.whitespace();
        Some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let found = self.bytes.get(self.pos..self.pos + word.len())?;
        self.pos += word.len();
        (found == word).then_some(())
    }

    /// A number. Decoded, it must fit a double: one whose decimal exponent
    /// cannot reach 300 always does; any other is decoded by serde_json
    /// itself, whose rounding decides the cases near the limit.
    fn number(&mut self, check: Check) -> Option<()> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let integer_digits = match self.peek()? {
            b'0' => {
                self.pos += 1;
                1
            }
            b'1'..=b'9' => self.digits(),
            _ => return None,
        };
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        let mut exponent = 0i64;
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            let negative = match self.peek() {
                Some(b'-') => {
                    self.pos += 1;
                    true
                }
                Some(b'+') => {
                    self.pos += 1;
                    false
                }
                _ => false,
            };
            let digits_start = self.pos;
            while let Some(digit @ b'0'..=b'9') = self.peek() {
                exponent = (exponent * 10 + i64::from(digit - b'0')).min(1 << 40);
                self.pos += 1;
            }
            if self.pos == digits_start {
                return None;
            }
            if negative {
                exponent = -exponent;
            }
        }
        // The number is below 10^(integer_digits + exponent).
        if check == Check::Decode && integer_digits as i64 + exponent >= 300 {
            serde_json::from_slice::<f64>(&self.bytes[start..self.pos]).ok()?;
        }
        Some(())
    }

    /// A run of digits: how many.
    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    /// The items array, from its `[`.
    fn items(&mut self, max_items: usize) -> Option<Vec<PushItem>> {
        self.expect(b'[')?;
        if self.close(b']') {
            return None;
        }
        let mut items = Vec::new();
        loop {
            if items.len() == max_items {
                return None;
            }
            let start = self.pos;
            items.push(self.item()?);
            if items.len() == 1 {
                // Room for as many more items as the rest of the array
                // holds if they are the size of the first: bodies are
                // usually uniform, and this spares the vector's regrowths.
                let room = (self.bytes.len() - self.pos) / (self.pos - start + 1);
                items.reserve_exact(room.min(max_items - 1));
            }
            if !self.next_member(b']')? {
                return Some(items);
            }
        }
    }

    /// One item, from its `{`.
    fn item(&mut self) -> Option<PushItem> {
        self.expect(b'{')?;
        let mut queue = None;
        let mut partition = None;
        let mut transaction_id = None;
        let mut payload = None;
        if !self.close(b'}') {
            loop {
                match self.field()? {
                    Field::Queue if queue.is_none() => queue = Some(self.name()?),
                    Field::Partition if partition.is_none() => {
                        partition = Some(if self.null() { None } else { Some(self.name()?) });
                    }
                    Field::TransactionId if transaction_id.is_none() => {
                        transaction_id = Some(if self.null() { None } else { Some(self.transaction_id()?) });
                    }
                    Field::Payload if payload.is_none() => {
                        let start = self.pos;
                        self.value(Check::Decode)?;
                        payload = Some(Payload::validated(self.slice_from(start)));
                    }
                    Field::Other => self.value(Check::Syntax)?,
                    // A field given twice.
                    _ => return None,
                }
                if !self.next_member(b'}')? {
                    break;
                }
            }
        }
        Some(PushItem {
            queue: queue?,
            partition: partition.flatten().unwrap_or_else(|| ByteString::from_static(DEFAULT_PARTITION)),
            payload: payload.unwrap_or_else(Payload::null),
            transaction_id: transaction_id.flatten(),
        })
    }

    /// An item's key and the colon after it: which field it names. The
    /// fields' own names, written without escapes, are matched as they
    /// stand; any other key is decoded first.
    fn field(&mut self) -> Option<Field> {
        const NAMED: [(&[u8], Field); 4] = [
            (b"\"queue\"", Field::Queue),
            (b"\"partition\"", Field::Partition),
            (b"\"transactionId\"", Field::TransactionId),
            (b"\"payload\"", Field::Payload),
        ];
        let rest = &self.bytes[self.pos..];
        let Some(&(name, field)) = NAMED.iter().find(|(name, _)| rest.starts_with(name)) else {
            let key = self.key()?;
            return Some(field_named(&key));
        };
        self.pos += name.len();
        self.whitespace();
        self.expect(b':')?;
        self.whitespace();
        Some(field)
    }

    /// Whether a `null` is next (then consumed).
    fn null(&mut self) -> bool {
        if self.bytes.get(self.pos..self.pos + 4) == Some(b"null") {
            self.pos += 4;
            true
        } else {
            false
        }
    }

    /// A decoded string value, a view of the body unless it holds an
    /// escape, and whether it did.
    fn decoded_string(&mut self) -> Option<(ByteString, bool)> {
        self.expect(b'"')?;
        let start = self.pos;
        let escaped = self.string(Check::Decode)?;
        let raw = &self.bytes[start..self.pos - 1];
        Some(if escaped {
            (ByteString::from(unescape(raw)), true)
        } else {
            (self.body.slice_ref(&self.body[start..self.pos - 1]), false)
        })
    }

    /// A queue or partition name, under `api::checked_name`'s rules.
    fn name(&mut self) -> Option<ByteString> {
        let (name, escaped) = self.decoded_string()?;
        if !escaped && name.is_ascii() {
            // ASCII is in NFC, and a string without escapes holds no control
            // character but DEL: the scan refuses the others.
            let fits = !name.is_empty() && name.len() <= MAX_NAME_BYTES && !name.as_bytes().contains(&0x7f);
            return fits.then_some(name);
        }
        let name = if name.is_ascii() {
            name
        } else {
            match unicode_normalization::is_nfc_quick(name.chars()) {
                unicode_normalization::IsNormalized::Yes => name,
                _ => ByteString::from(name.nfc().collect::<String>()),
            }
        };
        validate_name("", &name).ok()?;
        Some(name)
    }

    /// A transactionId, under `api::validate_transaction_id`'s rules.
    fn transaction_id(&mut self) -> Option<ByteString> {
        let (id, escaped) = self.decoded_string()?;
        // Only an escape can put U+0000 in a string: the scan refuses it raw.
        let fits = !id.is_empty() && id.len() <= MAX_TRANSACTION_ID_BYTES && !(escaped && id.contains('\0'));
        fits.then_some(id)
    }
}

fn field_named(key: &Key<'_>) -> Field {
    let matches = |name: &[u8]| key.is(name);
    if matches(b"queue") {
        Field::Queue
    } else if matches(b"partition") {
        Field::Partition
    } else if matches(b"transactionId") {
        Field::TransactionId
    } else if matches(b"payload") {
        Field::Payload
    } else {
        Field::Other
    }
}

/// The arrays and objects a value is inside: one bit each, set for an
/// object. The first 64 levels need no allocation.
#[derive(Default)]
struct Nesting {
    depth: usize,
    inline: u64,
    deeper: Vec<u64>,
}

impl Nesting {
    fn depth(&self) -> usize {
        self.depth
    }

    fn top(&self) -> Option<bool> {
        let level = self.depth.checked_sub(1)?;
        let word = if level < 64 { self.inline } else { self.deeper[level / 64 - 1] };
        Some(word >> (level % 64) & 1 == 1)
    }

    fn push(&mut self, object: bool) {
        let level = self.depth;
        if level >= 64 && level.is_multiple_of(64) {
            self.deeper.push(0);
        }
        let word = if level < 64 { &mut self.inline } else { &mut self.deeper[level / 64 - 1] };
        *word = (*word & !(1 << (level % 64))) | (u64::from(object) << (level % 64));
        self.depth += 1;
    }

    fn pop(&mut self) {
        self.depth -= 1;
        if self.depth >= 64 && self.depth.is_multiple_of(64) {
            self.deeper.pop();
        }
    }
}

/// Where the next byte a string's scan stops at is: a quote, a backslash or
/// a control character (or the end). Eight bytes at a time: a byte's high
/// bit in each mask marks a match, and the lowest marked byte is always a
/// true one (a borrow only spreads upwards from one).
fn next_special(bytes: &[u8], mut pos: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = bytes.get(pos..pos + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let found = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (word.wrapping_sub(ONES * 0x20) & !word);
        let found = found & HIGH;
        if found != 0 {
            return pos + (found.trailing_zeros() / 8) as usize;
        }
        pos += 8;
    }
    while let Some(&byte) = bytes.get(pos) {
        if byte == b'"' || byte == b'\\' || byte < 0x20 {
            break;
        }
        pos += 1;
    }
    pos
}

fn hex4(digits: &[u8]) -> Option<u16> {
    digits.iter().try_fold(0u16, |value, &digit| Some(value << 4 | (char::from(digit).to_digit(16)? as u16)))
}

/// The text a JSON string's content stands for, once [`Reader::string`] has
/// checked it with [`Check::Decode`].
fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut pos = 0;
    while let Some(&byte) = raw.get(pos) {
        pos += 1;
        if byte != b'\\' {
            out.push(byte);
            continue;
        }
        let escaped = raw[pos];
        pos += 1;
        let decoded = match escaped {
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = u32::from(hex4(&raw[pos..pos + 4]).expect("checked"));
                pos += 4;
                let code = if (0xD800..0xDC00).contains(&unit) {
                    let low = u32::from(hex4(&raw[pos + 2..pos + 6]).expect("checked"));
                    pos += 6;
                    0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                } else {
                    unit
                };
                char::from_u32(code).expect("checked")
            }
            other => char::from(other),
        };
        out.extend_from_slice(decoded.encode_utf8(&mut [0; 4]).as_bytes());
    }
    String::from_utf8(out).expect("checked")
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Both readings of `body`: the stepwise one, and the one-pass one.
    fn both(body: &str, max_items: usize) -> (Result<Vec<PushItem>, BadRequest>, Option<Vec<PushItem>>) {
        let bytes = Bytes::copy_from_slice(body.as_bytes());
        let stepwise = stepwise::parse_push(&bytes, max_items);
        let one_pass = read_push(&ByteString::from(body), max_items);
        (stepwise, one_pass)
    }

    /// The one-pass reader agrees with the stepwise reading on `body`: the
    /// same verdict and the same items.
    fn agree(body: &str, max_items: usize) -> Result<(), String> {
        match both(body, max_items) {
            (Ok(expected), Some(found)) if expected == found => Ok(()),
            (Err(_), None) => Ok(()),
            (stepwise, one_pass) => Err(format!("{body:?}: stepwise {stepwise:?}, one pass {one_pass:?}")),
        }
    }

    fn item(fields: &str) -> String {
        format!(r#"{{"items":[{{"queue":"q"{fields}}}]}}"#)
    }

    #[test]
    fn what_each_reading_accepts_and_refuses_is_the_same() {
        let mut bodies = vec![
            r#"{"items":[{"queue":"q"}]}"#.to_owned(),
            r#" {"items" : [ {"queue" : "q" , "partition" : null } ] } "#.to_owned(),
            r#"{"items":[{"queue":"q"}],"items":[{"queue":"q"}]}"#.to_owned(),
            r#"{"it\u0065ms":[{"qu\u0065ue":"q","partition":"p\u0031","transactionId":"t\"\\\/\b\f\n\r\t"}]}"#.to_owned(),
            r#"{"items":[{"queue":"q"},{"queue":"q","queue":"r"}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","partition":null,"partition":"p"}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","extra":1,"extra":2}],"other":["\ud800",1e999]}"#.to_owned(),
            r#"{"items":[{"queue":"q","\ud800":1}]}"#.to_owned(),
            r#"{"\udc00":1,"items":[{"queue":"q"}]}"#.to_owned(),
            r#"{"items":[{"queue":"\ud83d\ude00"}]}"#.to_owned(),
            r#"{"items":[{"queue":"\ud83d"}]}"#.to_owned(),
            r#"{"items":[{"queue":"\ud83d\u0041"}]}"#.to_owned(),
            r#"{"items":[{"queue":"\ud83d\n"}]}"#.to_owned(),
            r#"{"items":[{"queue":"\ud83d\ud83d\ude00"}]}"#.to_owned(),
            r#"{"items":[{"queue":"q\u0000"}]}"#.to_owned(),
            r#"{"items":[{"queue":"q\u007f"}]}"#.to_owned(),
            r#"{"items":[{"queue":"q\u0085"}]}"#.to_owned(),
            "{\"items\":[{\"queue\":\"q\u{85}\"}]}".to_owned(),
            "{\"items\":[{\"queue\":\"q\u{7f}\"}]}".to_owned(),
            "{\"items\":[{\"queue\":\"q\u{1}\"}]}".to_owned(),
            "{\"items\":[{\"queue\":\"cafe\u{301}\"}]}".to_owned(),
            "{\"items\":[{\"queue\":\"caf\u{e9}\",\"transactionId\":\"e\u{301}\"}]}".to_owned(),
            r#"{"items":[{"queue":"q","transactionId":"\u0000"}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","transactionId":""}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","transactionId":null}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","transactionId":5}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":null}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload": [ 1 , {"a" : "b"} , [] , {} ] }]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":"\ud800"}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":{"\ud800":1}}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":[1,]}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":{"a":1,}}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":01}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":-}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":1.}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":1e}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":tru}]}"#.to_owned(),
            r#"{"items":[{"queue":"q","payload":nul}]}"#.to_owned(),
            r#"{"items":[{"queue":"q"}]"#.to_owned(),
            r#"{"items":[{"queue":"q"}]}x"#.to_owned(),
            r#"{"items":[]}"#.to_owned(),
            r#"{"items":{}}"#.to_owned(),
            r#"{"items":null}"#.to_owned(),
            r#"{}"#.to_owned(),
            r#"[]"#.to_owned(),
            "".to_owned(),
            r#"{"items":[{"queue":"q"},3]}"#.to_owned(),
            r#"{"items":[{"queue":""}]}"#.to_owned(),
            format!(r#"{{"items":[{{"queue":"{}"}}]}}"#, "q".repeat(255)),
            format!(r#"{{"items":[{{"queue":"{}"}}]}}"#, "q".repeat(256)),
            format!(r#"{{"items":[{{"queue":"{}"}}]}}"#, "\u{e9}".repeat(128)),
            format!(r#"{{"items":[{{"queue":"{}"}}]}}"#, "e\u{301}".repeat(100)),
            item(&format!(r#","transactionId":"{}""#, "x".repeat(MAX_TRANSACTION_ID_BYTES))),
            item(&format!(r#","transactionId":"{}""#, "x".repeat(MAX_TRANSACTION_ID_BYTES + 1))),
        ];
        for number in [
            "0",
            "-0",
            "1e308",
            "1.7976931348623157e308",
            "1.7976931348623158e308",
            "1.7976931348623159e308",
            "1.8e308",
            "17976931348623157e292",
            "17976931348623159e292",
            "1e309",
            "-1e309",
            "1e400",
            "0e99999",
            "0.0e99999999999",
            "1e-99999",
            "1e-99999999999",
            "1e99999999999",
            "123456789012345678901234567890",
            "0.000000000000000000000000000001e330",
            "1E+2",
            "1e-2",
            "-12.5e-3",
        ] {
            bodies.push(item(&format!(r#","payload":{number}"#)));
            bodies.push(item(&format!(r#","ignored":{number}"#)));
        }
        bodies.push(item(&format!(r#","payload":{}"#, "9".repeat(308))));
        bodies.push(item(&format!(r#","payload":{}"#, "9".repeat(309))));
        bodies.push(item(&format!(r#","payload":{}"#, "1".repeat(400))));
        for depth in [126, 127, 128, 129] {
            bodies.push(item(&format!(r#","payload":{}{}"#, "[".repeat(depth), "]".repeat(depth))));
            bodies.push(item(&format!(r#","payload":{}1{}"#, r#"{"a":"#.repeat(depth), "}".repeat(depth))));
        }
        bodies.push(item(&format!(r#","ignored":{}{}"#, "[".repeat(100_000), "]".repeat(100_000))));
        bodies.push(item(&format!(r#","ignored":{}{}"#, "[{\"a\":".repeat(1_000), "}]".repeat(1_000))));
        for body in &bodies {
            for max_items in [1, 2, 10] {
                agree(body, max_items).unwrap();
            }
        }
        let accepted = bodies.iter().filter(|body| both(body, 10).0.is_ok()).count();
        assert!((20..bodies.len() - 20).contains(&accepted), "{accepted} of {} bodies accepted", bodies.len());
        let many = format!(r#"{{"items":[{}]}}"#, [r#"{"queue":"q"}"#; 11].join(","));
        for max_items in [1, 10, 11, 12] {
            agree(&many, max_items).unwrap();
        }
    }

    #[test]
    fn fields_are_views_of_the_body_unless_decoded() {
        let body = ByteString::from(r#"{"items":[{"queue":"q","partition":"p\u0031","transactionId":"t","payload":{"a": 1}}]}"#);
        let items = read_push(&body, 10).unwrap();
        let within = |text: &str| body.as_bytes().as_ptr_range().contains(&text.as_ptr());
        assert!(within(&items[0].queue));
        assert!(!within(&items[0].partition), "an escaped name is decoded");
        assert_eq!(items[0].partition, "p1");
        assert!(within(items[0].transaction_id.as_deref().unwrap()));
        assert!(within(items[0].payload.get()));
        assert_eq!(items[0].payload.get(), r#"{"a": 1}"#);
    }

    #[test]
    fn refusals_are_named_as_the_stepwise_reading_names_them() {
        for body in
            [r#"{"items":[{"queue":"q"},{"queue":1}]}"#, r#"{"items":[{"queue":"q","payload":[1e400]}]}"#, "{\"items\":[\u{ff}]}"]
        {
            let bytes = Bytes::copy_from_slice(body.as_bytes());
            assert_eq!(parse_push(&bytes, 10), stepwise::parse_push(&bytes, 10));
        }
        let invalid_utf8 = Bytes::from_static(b"{\"items\":[{\"queue\":\"\xff\"}]}");
        let refused = parse_push(&invalid_utf8, 10).unwrap_err();
        assert!(refused.message.starts_with("body: malformed JSON"), "{}", refused.message);
    }

    /// Pieces of push bodies, valid and not, that random bodies are made of.
    const PIECES: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        " ",
        "\"",
        "\\",
        "null",
        "true",
        "false",
        "0",
        "-1",
        "1.5e3",
        "1e400",
        "01",
        r#""items""#,
        r#""queue""#,
        r#""partition""#,
        r#""transactionId""#,
        r#""payload""#,
        r#""other""#,
        r#""q""#,
        r#""""#,
        r#""\u0000""#,
        r#""\ud800""#,
        r#""\udc00""#,
        r#""\ud800\udc00""#,
        r#""\n""#,
        r#""\x""#,
        "\"e\u{301}\"",
        "\"\u{e9}\"",
        "\"\u{85}\"",
        r#""\u00e9""#,
        r#""it\u0065ms""#,
        r#"{"items":["#,
        r#"{"queue":"q"}"#,
        r#"{"queue":"q","payload":"#,
        r#","transactionId":"t""#,
        "]}",
    ];

    fn body() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(PIECES), 0..40).prop_map(|pieces| pieces.concat())
    }

    /// Near-valid bodies: a valid one with a piece put in somewhere.
    fn near_valid() -> impl Strategy<Value = String> {
        (prop::collection::vec((0usize..4, prop::sample::select(PIECES)), 1..4), 0usize..200, prop::sample::select(PIECES))
            .prop_map(|(items, at, piece)| {
                let items: Vec<String> = items
                    .into_iter()
                    .map(|(shape, extra)| match shape {
                        0 => r#"{"queue":"q"}"#.to_owned(),
                        1 => format!(r#"{{"queue":"q","payload":{extra}}}"#),
                        2 => format!(r#"{{"queue":"q","transactionId":{extra},"partition":"p"}}"#),
                        _ => format!(r#"{{"queue":{extra}}}"#),
                    })
                    .collect();
                let mut body = format!(r#"{{"items":[{}]}}"#, items.join(","));
                let mut at = at.min(body.len());
                while !body.is_char_boundary(at) {
                    at -= 1;
                }
                body.insert_str(at, piece);
                body
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4_000))]

        #[test]
        fn random_bodies_are_read_alike(body in body(), max_items in 1usize..4) {
            agree(&body, max_items).map_err(TestCaseError::fail)?;
        }

        #[test]
        fn near_valid_bodies_are_read_alike(body in near_valid(), max_items in 1usize..4) {
            agree(&body, max_items).map_err(TestCaseError::fail)?;
        }
    }
}
