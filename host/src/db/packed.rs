//! A segment's messages packed as `stile.push` stores them, written straight
//! into the connection's buffer: ids as 16 bytes each (`bytea`),
//! transactionIds and payloads as one JSON array each (`text`), and the
//! cache's hash floors as 8 bytes each (`bytea`).
//!
//! Each is a view of the segment's own fields, so a bundle's parameters cost
//! no copy of a payload or transactionId and no allocation per segment
//! before tokio-postgres writes them.

use std::error::Error;

use bytes::{BufMut as _, BytesMut};
use bytestring::ByteString;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use uuid::Uuid;

use crate::json_string;
use crate::payload::Payload;

/// Message ids, 16 bytes each, concatenated in order: one `bytea`.
#[derive(Debug)]
pub struct PackedIds<'a>(pub &'a [Uuid]);

/// TransactionIds as one JSON array of strings: one `text`.
#[derive(Debug)]
pub struct JsonStrings<'a>(pub &'a [ByteString]);

/// Payloads as one JSON array of their texts, as sent: one `text`.
#[derive(Debug)]
pub struct JsonTexts<'a>(pub &'a [Payload]);

/// Hash floors, 8 bytes each (a big-endian bigint, as `stile.floor_at` reads
/// them), concatenated in order: one `bytea`.
#[derive(Debug)]
pub struct PackedFloors<'a>(pub &'a [i64]);

impl ToSql for PackedIds<'_> {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.reserve(16 * self.0.len());
        for id in self.0 {
            out.put_slice(id.as_bytes());
        }
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::BYTEA
    }

    to_sql_checked!();
}

impl ToSql for JsonStrings<'_> {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.reserve(2 + self.0.iter().map(|s| s.len() + 3).sum::<usize>());
        let mut writer = out.writer();
        write_array(&mut writer, self.0, |writer, s| json_string::write(writer, s))?;
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TEXT
    }

    to_sql_checked!();
}

impl ToSql for JsonTexts<'_> {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.reserve(2 + self.0.iter().map(|p| p.get().len() + 1).sum::<usize>());
        let mut writer = out.writer();
        write_array(&mut writer, self.0, |writer, p| std::io::Write::write_all(writer, p.get().as_bytes()))?;
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TEXT
    }

    to_sql_checked!();
}

impl ToSql for PackedFloors<'_> {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.reserve(8 * self.0.len());
        for &floor in self.0 {
            out.put_i64(floor);
        }
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::BYTEA
    }

    to_sql_checked!();
}

/// Writes `[`, each element by `element` separated by commas, and `]`.
fn write_array<W: std::io::Write, T, E>(
    writer: &mut W,
    elements: &[T],
    mut element: impl FnMut(&mut W, &T) -> Result<(), E>,
) -> Result<(), Box<dyn Error + Sync + Send>>
where
    E: Error + Sync + Send + 'static,
{
    writer.write_all(b"[")?;
    for (k, e) in elements.iter().enumerate() {
        if k > 0 {
            writer.write_all(b",")?;
        }
        element(writer, e)?;
    }
    writer.write_all(b"]")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(value: &dyn ToSql, ty: &Type) -> Vec<u8> {
        let mut out = BytesMut::new();
        value.to_sql_checked(ty, &mut out).expect("writes");
        out.to_vec()
    }

    #[test]
    fn transaction_ids_are_written_as_a_json_array_of_strings() {
        let ids = [ByteString::from("a"), ByteString::from("quote \" and \\ and \u{1}"), ByteString::from("é")];
        let text = written(&JsonStrings(&ids), &Type::TEXT);
        let back: Vec<String> = serde_json::from_slice(&text).expect("valid JSON");
        assert_eq!(back, ["a", "quote \" and \\ and \u{1}", "é"]);
        assert_eq!(written(&JsonStrings(&[]), &Type::TEXT), b"[]");
    }

    #[test]
    fn payloads_are_written_as_sent_in_one_array() {
        let payloads = [Payload::null(), Payload::from(&serde_json::json!({"a": [1, 2]}))];
        assert_eq!(written(&JsonTexts(&payloads), &Type::TEXT), br#"[null,{"a":[1,2]}]"#);
    }

    #[test]
    fn hash_floors_are_eight_big_endian_bytes_each_in_order() {
        let bytes = written(&PackedFloors(&[-1, 0x0102_0304_0506_0708]), &Type::BYTEA);
        assert_eq!(bytes, [[0xff; 8], [1, 2, 3, 4, 5, 6, 7, 8]].concat());
    }

    #[test]
    fn message_ids_are_sixteen_bytes_each_in_order() {
        let ids = [Uuid::from_u128(1), Uuid::from_u128(u128::MAX)];
        let bytes = written(&PackedIds(&ids), &Type::BYTEA);
        assert_eq!(bytes.len(), 32);
        assert_eq!(&bytes[..16], ids[0].as_bytes());
        assert_eq!(&bytes[16..], ids[1].as_bytes());
    }

    #[test]
    fn each_is_refused_for_another_type() {
        let mut out = BytesMut::new();
        assert!(JsonStrings(&[]).to_sql_checked(&Type::BYTEA, &mut out).is_err());
        assert!(PackedIds(&[]).to_sql_checked(&Type::TEXT, &mut out).is_err());
    }
}
