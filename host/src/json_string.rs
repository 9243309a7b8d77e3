//! A string written as a JSON string, byte for byte as serde_json writes it.
//!
//! Names and transactionIds rarely hold a character JSON must escape, so
//! the common case is a copy between quotes: at 100 items per request,
//! escaping every string through a serializer was among the gateway's
//! largest costs. Both the push answer and the bundle's parameters write
//! their strings here.

use std::io;

/// Writes `s` as a JSON string: copied between quotes when nothing in it
/// needs an escape (a quote, a backslash or a control character), else by
/// serde_json.
pub fn write<W: io::Write>(out: &mut W, s: &str) -> io::Result<()> {
    if s.bytes().all(needs_no_escape) {
        out.write_all(b"\"")?;
        out.write_all(s.as_bytes())?;
        out.write_all(b"\"")
    } else {
        serde_json::to_writer(out, s).map_err(io::Error::from)
    }
}

/// Whether JSON takes the byte as it is inside a string. DEL and bytes of
/// multibyte characters need no escape; serde_json escapes none of them.
fn needs_no_escape(b: u8) -> bool {
    b >= 0x20 && b != b'"' && b != b'\\'
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn written(s: &str) -> Vec<u8> {
        let mut out = Vec::new();
        write(&mut out, s).expect("a Vec takes every write");
        out
    }

    proptest! {
        // Strings drawn to hit every escape: quotes, backslashes, control
        // characters, DEL and characters beyond ASCII.
        #[test]
        fn a_string_is_written_as_serde_json_writes_it(s in "[a-z\"\\\\\u{0}-\u{1f}\u{7f}é€😀 ]{0,16}") {
            prop_assert_eq!(written(&s), serde_json::to_vec(&s).unwrap());
        }
    }

    #[test]
    fn a_plain_string_is_copied_between_quotes() {
        assert_eq!(written("order-7 é"), "\"order-7 é\"".as_bytes());
        assert_eq!(written(""), b"\"\"");
        assert_eq!(written("a\"b\\c\u{1}"), br#""a\"b\\c\u0001""#);
    }
}
