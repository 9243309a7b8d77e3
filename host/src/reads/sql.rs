//! Reads' calls: a page of a partition's messages and one message by its
//! transactionId (`host/sql/functions/reads.sql`).

use serde_json::value::RawValue;
use tokio_postgres::types::Json;
use uuid::Uuid;

use crate::db::{Db, DbError};
use crate::payload::Payload;

/// How much one read of messages may return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageBound {
    /// The most messages.
    pub messages: i64,
    /// The most bytes of answer, as [`StoredMessage::answer_bytes`] counts
    /// them; the page ends before the message that would cross it.
    pub bytes: usize,
}

/// A page of a partition's messages, in offset order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessagePage {
    pub messages: Vec<StoredMessage>,
    /// The page ended early, at its bound of bytes: more messages may follow
    /// the last one.
    pub truncated: bool,
}

/// A stored message.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    /// Its offset in the partition.
    pub offset: i64,
    /// Its message id.
    pub message_id: Uuid,
    /// Its transactionId.
    pub transaction_id: String,
    /// Its payload, as sent.
    pub payload: Payload,
    /// When its segment was committed (database clock), in ms since the
    /// epoch, rounded up like the `created_ms` of a committed segment.
    pub created_ms: i64,
}

impl Db {
    /// Up to `bound.messages` messages of a partition from `from_offset` on,
    /// in offset order (none for an unknown partition), ending before the
    /// message that would take the page past `bound.bytes`. PostgreSQL stops
    /// reading there too (`stile.read_messages`), and says where it stopped
    /// with a last row without its payload: a page is never built past its
    /// bound, on either side.
    pub async fn read_messages(
        &self,
        queue: &str,
        partition: &str,
        from_offset: i64,
        bound: PageBound,
    ) -> Result<MessagePage, DbError> {
        let limit = i32::try_from(bound.messages.max(0)).unwrap_or(i32::MAX);
        let max_bytes = i64::try_from(bound.bytes).unwrap_or(i64::MAX);
        let client = self.pool().get().await?;
        let stmt = client
            .prepare_cached(
                "SELECT \"offset\", message_id, transaction_id, payload, created_ms, answer_bytes \
                 FROM stile.read_messages($1, $2, $3, $4, $5)",
            )
            .await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [&queue, &partition, &from_offset, &limit, &max_bytes];
        let rows = client.query_raw(&stmt, params).await?;
        futures::pin_mut!(rows);
        let mut page = MessagePage::default();
        let mut bytes = 0usize;
        while let Some(row) = futures::StreamExt::next(&mut rows).await {
            let row = row?;
            // The bound is checked here as well, by this build's count: a
            // function of another build sharing the database during an
            // upgrade may count otherwise.
            let crossing = match row.try_get::<_, Option<Json<Box<RawValue>>>>("payload")? {
                Some(Json(payload)) => {
                    let message = message_with(&row, payload)?;
                    bytes += message.answer_bytes();
                    if bytes <= bound.bytes {
                        page.messages.push(message);
                        continue;
                    }
                    (message.offset, message.answer_bytes())
                }
                None => {
                    let answer_bytes: i64 = row.try_get("answer_bytes")?;
                    (row.try_get("offset")?, usize::try_from(answer_bytes).unwrap_or(usize::MAX))
                }
            };
            if page.messages.is_empty() {
                let (offset, size) = crossing;
                return Err(DbError::TooLarge(format!(
                    "the message at offset {offset} is {size} bytes, more than the answer limit of {} bytes",
                    bound.bytes
                )));
            }
            page.truncated = true;
            break;
        }
        Ok(page)
    }

    /// The newest stored message of a partition with this transactionId
    /// (`hash` is its [`txn_hash`](crate::hash::txn_hash)), found through the
    /// log rows' hashes and checked against the stored transactionId.
    pub async fn message_by_transaction_id(
        &self,
        queue: &str,
        partition: &str,
        hash: [u8; 16],
        transaction_id: &str,
    ) -> Result<Option<StoredMessage>, DbError> {
        let client = self.pool().get().await?;
        let stmt = client
            .prepare_cached(
                "SELECT \"offset\", message_id, transaction_id, payload, created_ms \
                 FROM stile.message_by_transaction_id($1, $2, $3, $4)",
            )
            .await?;
        let rows = client.query(&stmt, &[&queue, &partition, &&hash[..], &transaction_id]).await?;
        rows.first().map(stored_message).transpose()
    }
}

impl StoredMessage {
    /// About what the message takes in an answer: its payload and
    /// transactionId as stored, and its other fields. `stile.read_messages`
    /// counts the same, to stop where the gateway would.
    pub fn answer_bytes(&self) -> usize {
        const FIELDS_BYTES: usize = 128;
        self.payload.get().len() + self.transaction_id.len() * 6 + FIELDS_BYTES
    }
}

fn stored_message(row: &tokio_postgres::Row) -> Result<StoredMessage, DbError> {
    // Read as the text stored, like it was written, and answered as is: no
    // tree is built only to be encoded again.
    let Json(payload): Json<Box<RawValue>> = row.try_get("payload")?;
    message_with(row, payload)
}

/// The message of `row` whose payload, already read from it, is `payload`.
fn message_with(row: &tokio_postgres::Row, payload: Box<RawValue>) -> Result<StoredMessage, DbError> {
    Ok(StoredMessage {
        offset: row.try_get("offset")?,
        message_id: row.try_get("message_id")?,
        transaction_id: row.try_get("transaction_id")?,
        payload: Payload::from(payload),
        created_ms: row.try_get("created_ms")?,
    })
}
