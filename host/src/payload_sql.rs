//! A payload as a PostgreSQL parameter: bound to a `json` (or `jsonb`)
//! parameter as its text, written straight from the buffer it is a view of.
//! (Apart from `payload.rs`, which the fuzz targets compile without
//! PostgreSQL's client.)

use bytes::{BufMut as _, BytesMut};
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use crate::payload::Payload;

impl ToSql for Payload {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if *ty == Type::JSONB {
            // jsonb's binary form: a version byte, then the text.
            out.put_u8(1);
        }
        out.put_slice(self.get().as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::JSON | Type::JSONB)
    }

    to_sql_checked!();
}
