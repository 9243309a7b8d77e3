//! `POST /api/v1/push`: a body of items read in one pass ([`body`], with
//! [`stepwise`] as the reference reading and the one that names what is
//! wrong), pushed through the gateway, and answered item by item
//! ([`answer`]). [`route`] is the handler.

pub mod answer;
pub mod body;
pub mod item;
pub mod route;
pub mod stepwise;

pub use body::{parse_items, parse_push};
pub use item::PushItem;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{BadRequest, DEFAULT_PARTITION, MAX_TRANSACTION_ID_BYTES};
    use crate::payload::Payload;

    fn push(body: &str) -> Result<Vec<PushItem>, BadRequest> {
        parse_push(&bytes::Bytes::copy_from_slice(body.as_bytes()), 10)
    }

    #[test]
    fn a_minimal_item_gets_the_default_partition_and_a_null_payload() {
        let items = push(r#"{"items":[{"queue":"q"}]}"#).unwrap();
        assert_eq!(
            items,
            vec![PushItem {
                queue: "q".into(),
                partition: DEFAULT_PARTITION.into(),
                payload: Payload::null(),
                transaction_id: None
            }]
        );
    }

    #[test]
    fn errors_name_the_field_and_the_index() {
        let cases = [
            (r#"{"items":[{"queue":"q"},{"queue":1}]}"#, "items[1].queue: expected a string"),
            (r#"{"items":[{"queue":""}]}"#, "items[0].queue: must not be empty"),
            (r#"{"items":[{"queue":"a\u001fb"}]}"#, "items[0].queue: must not contain control characters"),
            (r#"{"items":[{"queue":"q","partition":5}]}"#, "items[0].partition: expected a string"),
            (r#"{"items":[{"queue":"q","transactionId":7}]}"#, "items[0].transactionId: expected a string"),
            (r#"{"items":[{"queue":"q","transactionId":""}]}"#, "items[0].transactionId: must not be empty"),
            (r#"{"items":[{}]}"#, "items[0].queue: missing"),
            (r#"{"items":[3]}"#, "items[0]: expected an object"),
            (r#"{"items":{}}"#, "items: expected an array"),
            (r#"{"items":[]}"#, "items: must not be empty"),
            (r#"{}"#, "items: missing"),
            (r#"[]"#, "body: expected a JSON object"),
            (r#"{"items":[{"queue":"q""#, "body: truncated JSON"),
            (r#"{"items":[{"queue":q}]}"#, "body: malformed JSON"),
        ];
        for (body, expected) in cases {
            let error = push(body).unwrap_err();
            assert_eq!(error.status, 400, "{body}");
            assert!(error.message.starts_with(expected), "{body}: {}", error.message);
        }
    }

    #[test]
    fn payloads_are_kept_as_sent_and_other_fields_decoded() {
        let body = r#"{"items":[
            {"queue":"q","partition":"p\u0031","transactionId":"t\"1","payload": {"n": 123456789012345678901234567890, "s": "\u00e9" }},
            {"queue":"q","payload":null,"extra":[1,2]},
            {"queue":"q","partition":null,"transactionId":null,"payload":[ 1 , 2 ]}
        ]}"#;
        let items = push(body).unwrap();
        assert_eq!(items[0].partition, "p1");
        assert_eq!(items[0].transaction_id.as_deref(), Some("t\"1"));
        assert_eq!(items[0].payload.get(), r#"{"n": 123456789012345678901234567890, "s": "\u00e9" }"#);
        assert_eq!(items[1].payload, Payload::null());
        assert_eq!((&*items[2].partition, items[2].transaction_id.as_deref()), (DEFAULT_PARTITION, None));
        assert_eq!(items[2].payload.get(), "[ 1 , 2 ]");
    }

    #[test]
    fn null_names_and_repeated_fields_are_refused_by_name() {
        let cases = [
            (r#"{"items":[{"queue":null}]}"#, "items[0].queue: expected a string, got null"),
            (r#"{"items":[{"queue":"q"},{"queue":"q","queue":"r"}]}"#, "items[1]: duplicate field `queue`"),
            (r#"{"items":[{"queue":"q","transactionId":[]}]}"#, "items[0].transactionId: expected a string, got an array"),
            (r#"{"items":[{"queue":"q","partition":true}]}"#, "items[0].partition: expected a string, got a boolean"),
            (r#"{"items":"x"}"#, "items: expected an array, got a string"),
            (r#"  7 "#, "body: expected a JSON object"),
            (r#"{"items":[{"queue":"\ud800"}]}"#, "items[0].queue: malformed JSON string"),
            (r#"{"items":[{"queue":"q","transactionId":"\udfff"}]}"#, "items[0].transactionId: malformed JSON string"),
            (r#"{"items":[{"queue":"q","payload":{"a":[1e400]}}]}"#, "items[0].payload: malformed JSON (number out of range"),
            (r#"{"items":[{"queue":"q","payload":"\ud800"}]}"#, "items[0].payload: malformed JSON"),
        ];
        for (body, expected) in cases {
            let error = push(body).unwrap_err();
            assert_eq!(error.status, 400, "{body}");
            assert!(error.message.starts_with(expected), "{body}: {}", error.message);
        }
    }

    #[test]
    fn transaction_id_limit_is_inclusive() {
        let at_limit = "x".repeat(MAX_TRANSACTION_ID_BYTES);
        let body = format!(r#"{{"items":[{{"queue":"q","transactionId":"{at_limit}"}}]}}"#);
        assert!(push(&body).is_ok());
        let over = "x".repeat(MAX_TRANSACTION_ID_BYTES + 1);
        let body = format!(r#"{{"items":[{{"queue":"q","transactionId":"{over}"}}]}}"#);
        assert!(push(&body).unwrap_err().message.contains("65536 bytes exceed"));
    }

    #[test]
    fn too_many_items_is_413() {
        let items = [r#"{"queue":"q"}"#; 11].join(",");
        let error = push(&format!(r#"{{"items":[{items}]}}"#)).unwrap_err();
        assert_eq!(error.status, 413);
    }
}
