//! `POST /api/v1/configure`: a queue's options, validated here and by the
//! database ([`sql`]), which owns the list of known keys. [`route`] is the
//! handler.

pub mod route;
mod sql;

use serde_json::{Map, Value};

use crate::api::{BadRequest, name_value, nul_refused, parse_json, refuse_nul_in, type_name};
pub use sql::{ConfigureError, ConfigureMode};

/// The longest option value: a string's UTF-8 bytes (as long as a queue's
/// name may be), or any other value's JSON text.
pub const MAX_OPTION_BYTES: usize = crate::api::MAX_NAME_BYTES;

/// A validated `POST /api/v1/configure` body. Option values are checked by
/// the database layer, which owns the list of known keys.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigureRequest {
    pub queue: String,
    pub options: Map<String, Value>,
    pub mode: ConfigureMode,
}

/// Parses a configure body: `{"queue", "options"?, "mode"?, "namespace"?, "task"?}`.
/// Queen's clients send `namespace` and `task` beside the options; they are
/// stored as options.
pub fn parse_configure(body: &[u8]) -> Result<ConfigureRequest, BadRequest> {
    let Value::Object(mut root) = parse_json(body)? else {
        return Err(BadRequest::new("body: expected a JSON object"));
    };
    let queue = match root.remove("queue") {
        Some(value) => name_value("queue", value)?,
        None => return Err(BadRequest::new("queue: missing")),
    };
    let mut options = match root.remove("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(options)) => options,
        Some(other) => return Err(BadRequest::new(format!("options: expected an object, got {}", type_name(&other)))),
    };
    let mode = match root.remove("mode") {
        None | Some(Value::Null) => ConfigureMode::Merge,
        Some(Value::String(mode)) if mode == "merge" => ConfigureMode::Merge,
        Some(Value::String(mode)) if mode == "replace" => ConfigureMode::Replace,
        Some(other) => return Err(BadRequest::new(format!("mode: expected \"merge\" or \"replace\", got {other}"))),
    };
    for key in ["namespace", "task"] {
        if let Some(value) = root.remove(key) {
            options.insert(key.to_owned(), value);
        }
    }
    if let Some(key) = root.keys().next() {
        return Err(BadRequest::new(format!("{key}: unknown field of a configure request")));
    }
    for (key, value) in &options {
        refuse_nul_in(format_args!("options.{key}"), value)?;
        if key.contains('\0') {
            return Err(nul_refused("options"));
        }
        // Every option is a number, a boolean or a short string (`namespace`,
        // `task`), stored with the queue and echoed by every configure: a
        // longer one is a mistake, or a client's way to grow the table.
        let bytes = match value {
            Value::String(text) => text.len(),
            other => other.to_string().len(),
        };
        if bytes > MAX_OPTION_BYTES {
            return Err(BadRequest::new(format!("options.{key}: {bytes} bytes exceed the limit of {MAX_OPTION_BYTES}")));
        }
    }
    Ok(ConfigureRequest { queue, options, mode })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::{ConfigureMode, parse_configure};

    #[test]
    fn configure_folds_namespace_and_task_into_options_and_refuses_unknown_fields() {
        let request =
            parse_configure(br#"{"queue":"q","namespace":"n","task":"t","options":{"dedupWindowSeconds":5},"mode":"replace"}"#)
                .unwrap();
        assert_eq!(request.mode, ConfigureMode::Replace);
        assert_eq!(request.options.get("namespace"), Some(&Value::from("n")));
        assert_eq!(request.options.get("dedupWindowSeconds"), Some(&Value::from(5)));
        let error = parse_configure(br#"{"queue":"q","colour":"red"}"#).unwrap_err();
        assert!(error.message.starts_with("colour:"), "{}", error.message);
        let error = parse_configure(br#"{"queue":"q","mode":"upsert"}"#).unwrap_err();
        assert!(error.message.starts_with("mode:"), "{}", error.message);
        let long = format!(r#"{{"queue":"q","namespace":"{}"}}"#, "n".repeat(256));
        let error = parse_configure(long.as_bytes()).unwrap_err();
        assert_eq!(error.message, "options.namespace: 256 bytes exceed the limit of 255");
        let at_limit = format!(r#"{{"queue":"q","options":{{"task":"{}"}}}}"#, "t".repeat(255));
        assert!(parse_configure(at_limit.as_bytes()).is_ok());
        let long = format!(r#"{{"queue":"q","options":{{"dedupWindowSeconds":"{}"}}}}"#, "1".repeat(300));
        let error = parse_configure(long.as_bytes()).unwrap_err();
        assert!(error.message.starts_with("options.dedupWindowSeconds: 300 bytes exceed"), "{}", error.message);
    }
}
