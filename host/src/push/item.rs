//! What a push is made of: one item, as read from a body.

use bytestring::ByteString;

use crate::payload::Payload;

/// One validated item of a push. Each field is a view of the request's body
/// (or a buffer of its own when it had to be decoded): cloning one copies no
/// text.
#[derive(Clone, Debug, PartialEq)]
pub struct PushItem {
    pub queue: ByteString,
    pub partition: ByteString,
    /// Stored as sent; `null` when the item has none.
    pub payload: Payload,
    /// `None` when the producer sent none: the gateway then uses the message id.
    pub transaction_id: Option<ByteString>,
}
