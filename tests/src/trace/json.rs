//! The trace as the text of its file: the top-level object, and the layout
//! the checked-in file keeps, so that a freshly recorded trace can be
//! compared with it byte for byte.

use std::borrow::Cow;
use std::{fmt, io};

use serde::{Deserialize, Serialize};
use serde_json::ser::{CompactFormatter, Formatter};
use stile_guest::ShardConfig;

use super::REGENERATE;
use super::model::{NotedCall, Trace};
use super::wire::ShardConfigDef;

/// The value of the file's `format` key.
pub const FORMAT: &str = "stile-dedup-trace";

/// The version of the file format this module reads and writes.
pub const VERSION: u64 = 1;

/// The interface the trace exercises.
pub const INTERFACE: &str = "stile:dedup/cache@0.1.0";

/// The trace as the checked-in file holds it: two-space indentation, keys
/// in a fixed order, lists of numbers on one line, one hash per line.
///
/// # Panics
///
/// If a number in the trace does not fit a double exactly, which a reader
/// in JavaScript would round.
pub fn to_json(trace: &Trace) -> String {
    let document = Document {
        format: FORMAT.into(),
        version: VERSION,
        interface: INTERFACE.into(),
        about: ABOUT.into(),
        regenerate: REGENERATE.into(),
        config: trace.config,
        calls: Cow::Borrowed(&trace.calls),
    };
    let mut out = Vec::new();
    document
        .serialize(&mut serde_json::Serializer::with_formatter(&mut out, Layout::default()))
        .unwrap_or_else(|error| panic!("the trace cannot be written: {error}"));
    out.push(b'\n');
    String::from_utf8(out).expect("JSON text is UTF-8")
}

/// Reads a trace file's text.
pub fn from_json(text: &str) -> Result<Trace, ParseError> {
    // The header first, so that a file of another version is refused as
    // such rather than for whatever its calls look like.
    let header: Header = serde_json::from_str(text).map_err(ParseError::Json)?;
    if header.format != FORMAT || header.version != VERSION {
        return Err(ParseError::Format { format: header.format, version: header.version });
    }
    let document: Document<'_> = serde_json::from_str(text).map_err(ParseError::Json)?;
    Ok(Trace { config: document.config, calls: document.calls.into_owned() })
}

/// Why a trace file could not be read.
#[derive(Debug)]
pub enum ParseError {
    /// The text is not JSON, or not a trace's.
    Json(serde_json::Error),
    /// The file says it is of another format, or another version of this one.
    Format { format: String, version: u64 },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Json(error) => write!(f, "malformed trace: {error}"),
            ParseError::Format { format, version } => {
                write!(f, "malformed trace: not a {FORMAT} version {VERSION} file ({format:?} version {version})")
            }
        }
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ParseError::Json(error) => Some(error),
            ParseError::Format { .. } => None,
        }
    }
}

/// What the file says it holds, for whoever opens it without this module.
const ABOUT: &str = "Calls on one shard of the stile dedup cache, with the answers the native core gave. \
                     Every host of the component must give the same answers.";

/// The largest magnitude a number in the file may have, so that a parser
/// reading numbers as doubles (JavaScript's) reads it exactly.
const SAFE_INTEGER: u128 = (1 << 53) - 1;

/// The file's top-level object, its keys in the order the file lists them.
/// Only `format`, `version`, `config` and `calls` are read back; the rest
/// are for people and for the other hosts.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Document<'a> {
    format: Cow<'a, str>,
    version: u64,
    #[serde(default)]
    interface: Cow<'a, str>,
    #[serde(default)]
    about: Cow<'a, str>,
    #[serde(default)]
    regenerate: Cow<'a, str>,
    #[serde(with = "ShardConfigDef")]
    config: ShardConfig,
    calls: Cow<'a, [NotedCall]>,
}

/// What a file says it is.
#[derive(Deserialize)]
struct Header {
    format: String,
    version: u64,
}

/// serde_json's pretty layout (two spaces per level, one item per line),
/// except that a list whose first item is a number stays on one line, as
/// `local-hits` does in the file; and a number that a double cannot hold
/// exactly is an error.
///
/// Whether a list is one of numbers shows only once its first item is
/// written, so the separator before each item waits until then.
#[derive(Debug, Default)]
struct Layout {
    /// The nesting depth, which sets the indentation.
    depth: usize,
    /// Whether the innermost open list or object has an item yet.
    has_value: bool,
    /// Per open list, whether it is laid out on one line.
    lists: Vec<bool>,
    /// A list item is next: whether it is the list's first. Its separator is
    /// written once the item shows what it is.
    pending_item: Option<bool>,
}

impl Layout {
    /// Writes what goes before a value: nothing, unless it is a list's item.
    fn begin_value<W: ?Sized + io::Write>(&mut self, writer: &mut W, number: bool) -> io::Result<()> {
        let Some(first) = self.pending_item.take() else {
            return Ok(());
        };
        let inline = self.lists.last_mut().expect("a list item is inside a list");
        if first {
            *inline = number;
        }
        if *inline {
            if !first {
                writer.write_all(b", ")?;
            }
            Ok(())
        } else {
            writer.write_all(if first { b"\n" } else { b",\n" })?;
            self.indent(writer)
        }
    }

    fn indent<W: ?Sized + io::Write>(&self, writer: &mut W) -> io::Result<()> {
        (0..self.depth).try_for_each(|_| writer.write_all(b"  "))
    }
}

/// Each integer method checks the number's magnitude, then writes it as
/// serde_json would.
macro_rules! integers {
    ($($method:ident: $type:ty),* $(,)?) => {$(
        fn $method<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: $type) -> io::Result<()> {
            if !i128::try_from(value).is_ok_and(|value| value.unsigned_abs() <= SAFE_INTEGER) {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{value} does not fit a double exactly")));
            }
            self.begin_value(writer, true)?;
            CompactFormatter.$method(writer, value)
        }
    )*};
}

impl Formatter for Layout {
    integers!(
        write_i8: i8, write_i16: i16, write_i32: i32, write_i64: i64, write_i128: i128,
        write_u8: u8, write_u16: u16, write_u32: u32, write_u64: u64, write_u128: u128,
    );

    fn write_f32<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f32) -> io::Result<()> {
        self.begin_value(writer, true)?;
        CompactFormatter.write_f32(writer, value)
    }

    fn write_f64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        self.begin_value(writer, true)?;
        CompactFormatter.write_f64(writer, value)
    }

    fn write_number_str<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: &str) -> io::Result<()> {
        self.begin_value(writer, true)?;
        CompactFormatter.write_number_str(writer, value)
    }

    fn write_null<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.begin_value(writer, false)?;
        CompactFormatter.write_null(writer)
    }

    fn write_bool<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: bool) -> io::Result<()> {
        self.begin_value(writer, false)?;
        CompactFormatter.write_bool(writer, value)
    }

    fn begin_string<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.begin_value(writer, false)?;
        CompactFormatter.begin_string(writer)
    }

    fn write_raw_fragment<W: ?Sized + io::Write>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()> {
        self.begin_value(writer, false)?;
        CompactFormatter.write_raw_fragment(writer, fragment)
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.begin_value(writer, false)?;
        self.lists.push(false);
        self.depth += 1;
        self.has_value = false;
        writer.write_all(b"[")
    }

    fn begin_array_value<W: ?Sized + io::Write>(&mut self, _writer: &mut W, first: bool) -> io::Result<()> {
        self.pending_item = Some(first);
        Ok(())
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        let inline = self.lists.pop().expect("a list ends after it began");
        self.depth -= 1;
        if self.has_value && !inline {
            writer.write_all(b"\n")?;
            self.indent(writer)?;
        }
        writer.write_all(b"]")
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.begin_value(writer, false)?;
        self.depth += 1;
        self.has_value = false;
        writer.write_all(b"{")
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        writer.write_all(if first { b"\n" } else { b",\n" })?;
        self.indent(writer)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            writer.write_all(b"\n")?;
            self.indent(writer)?;
        }
        writer.write_all(b"}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{OwnedSegment, record};

    /// Lays out `value` as the file would.
    fn laid_out(value: &impl Serialize) -> Result<String, serde_json::Error> {
        let mut out = Vec::new();
        value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, Layout::default()))?;
        Ok(String::from_utf8(out).expect("JSON text is UTF-8"))
    }

    #[test]
    fn lists_of_numbers_stay_on_one_line() {
        let value = serde_json::json!({ "hits": [0, 1, 2], "none": [], "hashes": ["a", "b"], "rows": [{ "x": [7] }] });
        let expected = "{\n  \"hashes\": [\n    \"a\",\n    \"b\"\n  ],\n  \"hits\": [0, 1, 2],\n  \"none\": [],\n  \
                        \"rows\": [\n    {\n      \"x\": [7]\n    }\n  ]\n}";
        assert_eq!(laid_out(&value).expect("lays out"), expected);
    }

    #[test]
    fn a_number_a_double_cannot_hold_is_refused() {
        assert_eq!(laid_out(&[(1_u64 << 53) - 1]).expect("fits"), "[9007199254740991]");
        assert_eq!(laid_out(&[-(1_i64 << 53) + 1]).expect("fits"), "[-9007199254740991]");
        assert!(laid_out(&[1_u64 << 53]).is_err());
        assert!(laid_out(&[-(1_i64 << 53)]).is_err());
    }

    #[test]
    fn the_recorded_trace_reads_back() {
        let trace = record();
        assert_eq!(from_json(&to_json(&trace)).expect("reads back"), trace);
    }

    #[test]
    fn each_call_is_written_under_its_name() {
        for step in record().calls {
            let written = serde_json::to_value(&step).expect("a step serializes");
            assert_eq!(written["call"], step.call.name());
        }
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let text = to_json(&record()).replacen("\"version\": 1,", "\"version\": 2,", 1);
        let error = from_json(&text).expect_err("version 2 is not read");
        assert!(matches!(error, ParseError::Format { version: 2, .. }), "{error}");
    }

    #[test]
    fn hashes_are_32_hex_digits_each() {
        let segment = |hashes: &str| format!(r#"{{"partition": 1, "window-ms": 60000, "hashes": [{hashes}]}}"#);
        let read = serde_json::from_str::<OwnedSegment>(&segment(r#""000102030405060708090a0b0c0d0e0F", "ff""#));
        assert!(read.is_err(), "a short hash is refused");
        let read = serde_json::from_str::<OwnedSegment>(&segment(r#""000102030405060708090a0b0c0d0e0F""#)).expect("reads");
        assert_eq!(read.hashes, (0..16).collect::<Vec<u8>>());
        assert!(laid_out(&read).expect("writes").contains(r#""000102030405060708090a0b0c0d0e0f""#));
        for bad in [r#""000102030405060708090a0b0c0d0e0g""#, r#""+00102030405060708090a0b0c0d0e0f""#, "17"] {
            assert!(serde_json::from_str::<OwnedSegment>(&segment(bad)).is_err(), "{bad} is refused");
        }
    }
}
