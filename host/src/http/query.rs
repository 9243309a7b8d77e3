//! A request's query parameters.

use std::collections::HashMap;

use crate::api::BadRequest;

/// A request's query parameters by name, decoded as a form's (`+` is a
/// space).
#[derive(Debug, Default)]
pub struct Query(HashMap<String, String>);

impl Query {
    /// Parses `raw` (the part of the URI after `?`). A parameter given
    /// twice, or one that is not UTF-8 once decoded, is refused: read loosely
    /// (the last one kept, a byte replaced by U+FFFD), either would name
    /// another queue or bound than the one the client sent.
    pub fn parse(raw: &str) -> Result<Query, BadRequest> {
        let mut parameters = HashMap::new();
        for pair in raw.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key =
                form_decoded(key).ok_or_else(|| BadRequest::new("query: a parameter's name is not percent-encoded UTF-8"))?;
            let value = form_decoded(value).ok_or_else(|| BadRequest::new(format!("{key}: not percent-encoded UTF-8")))?;
            if parameters.contains_key(&key) {
                return Err(BadRequest::new(format!("{key}: given more than once")));
            }
            parameters.insert(key, value);
        }
        Ok(Query(parameters))
    }

    /// The parameter `key`, when given.
    pub fn get(&self, key: &str) -> Option<&String> {
        self.0.get(key)
    }

    /// Takes the parameter `key` out, when given.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        self.0.remove(key)
    }

    /// The parameter `key` as an integer, `default` when not given.
    pub fn integer(&self, key: &str, default: i64) -> Result<i64, BadRequest> {
        match self.0.get(key) {
            None => Ok(default),
            Some(raw) => raw.parse().map_err(|_| BadRequest::new(format!("{key}: expected an integer, got {raw:?}"))),
        }
    }
}

fn form_decoded(text: &str) -> Option<String> {
    let spaced = text.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced).decode_utf8().ok().map(|decoded| decoded.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_form_decoded_and_given_once() {
        let query = Query::parse("queue=a+b&partition=p%2F1&limit=10").unwrap();
        assert_eq!(query.get("queue").map(String::as_str), Some("a b"));
        assert_eq!(query.get("partition").map(String::as_str), Some("p/1"));
        assert_eq!(query.integer("limit", 100).unwrap(), 10);
        assert_eq!(query.integer("fromOffset", 7).unwrap(), 7);
        assert!(Query::parse("queue=a&queue=b").unwrap_err().message.contains("given more than once"));
        assert!(Query::parse("queue=%FF").is_err());
        assert!(Query::parse("limit=ten").unwrap().integer("limit", 1).unwrap_err().message.contains("expected an integer"));
    }
}
