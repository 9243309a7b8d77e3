//! The handlers of the reads of messages.

use hyper::StatusCode;
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::{PageBound, StoredMessage};
use crate::api::{self, BadRequest};
use crate::hash::txn_hash;
use crate::http::call::Call;
use crate::http::query::Query;
use crate::http::reply::{Failure, Reply, json_reply};

/// A page of a partition's messages from `fromOffset`, at most `limit` and
/// at most what the answer limit holds (`truncated` when it ended there).
pub async fn messages(mut call: Call<'_>) -> Result<Reply, Failure> {
    let query = call.query()?;
    let (queue, partition) = queue_and_partition(&query)?;
    let from = query.integer("fromOffset", 0)?;
    if from < 0 {
        return Err(BadRequest::new(format!("fromOffset: must be 0 or more, got {from}")).into());
    }
    let limit = query.integer("limit", 100)?;
    if !(1..=10_000).contains(&limit) {
        return Err(BadRequest::new("limit: must be between 1 and 10000").into());
    }
    let room = call.answer_room()?;
    let bound = PageBound { messages: limit, bytes: room.saturating_sub(1024) };
    let db = call.app.gateway.db();
    let page = db.read_messages(&queue, &partition, from, bound).await.map_err(|e| call.read_failure(room, e))?;
    let messages: Vec<MessageReply<'_>> = page.messages.iter().map(MessageReply::from).collect();
    let reply = MessagesReply { messages, partition: &partition, queue: &queue, truncated: page.truncated };
    Ok(json_reply(StatusCode::OK, &reply))
}

/// The newest message of a partition with a transactionId, or 404.
pub async fn by_transaction_id(mut call: Call<'_>) -> Result<Reply, Failure> {
    let query = call.query()?;
    let (queue, partition) = queue_and_partition(&query)?;
    let Some(transaction_id) = query.get("transactionId").filter(|id| !id.is_empty()) else {
        return Err(BadRequest::new("transactionId: missing").into());
    };
    api::validate_transaction_id("transactionId", transaction_id)?;
    let hash = txn_hash(transaction_id);
    call.answer_room()?;
    match call.app.gateway.db().message_by_transaction_id(&queue, &partition, hash, transaction_id).await? {
        Some(message) => Ok(json_reply(StatusCode::OK, &MessageReply::from(&message))),
        None => Err(Failure::Status(StatusCode::NOT_FOUND, format!("transactionId: no message with it in {queue}/{partition}"))),
    }
}

fn queue_and_partition(query: &Query) -> Result<(String, String), BadRequest> {
    let queue = api::checked_name("queue", query.get("queue").cloned().unwrap_or_default())?;
    let partition = query.get("partition").cloned().unwrap_or_else(|| api::DEFAULT_PARTITION.to_owned());
    let partition = api::checked_name("partition", partition)?;
    Ok((queue, partition))
}

/// A stored message as the read endpoints answer it. Serialised directly
/// rather than through a `Value`, so that the payload goes out as the text
/// stored. (Fields in alphabetical order, as a `Value` would print them.)
#[derive(Serialize)]
struct MessageReply<'a> {
    created_at: i64,
    message_id: Uuid,
    offset: i64,
    payload: &'a RawValue,
    transaction_id: &'a str,
}

impl<'a> From<&'a StoredMessage> for MessageReply<'a> {
    fn from(message: &'a StoredMessage) -> MessageReply<'a> {
        MessageReply {
            created_at: message.created_ms,
            message_id: message.message_id,
            offset: message.offset,
            payload: message.payload.raw(),
            transaction_id: &message.transaction_id,
        }
    }
}

#[derive(Serialize)]
struct MessagesReply<'a> {
    messages: Vec<MessageReply<'a>>,
    partition: &'a str,
    queue: &'a str,
    /// Present when the page ended at the answer limit, before `limit`
    /// messages: more may follow its last offset.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}
