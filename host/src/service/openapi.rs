//! The OpenAPI document of the HTTP API (`host/openapi.json`), served at
//! `GET /api/v1/openapi.json`.
//!
//! It is kept by hand beside the code it describes; the tests below hold it
//! to the route table, so that a route added to [`crate::http::routes::ROUTES`]
//! without its description (or the reverse) fails the build's tests.

/// The document, as served.
pub const DOCUMENT: &str = include_str!("../../openapi.json");

#[cfg(test)]
mod tests {
    use hyper::Method;
    use serde_json::Value;

    use super::DOCUMENT;
    use crate::http::router;
    use crate::http::routes::ROUTES;

    /// The methods an OpenAPI path item may describe.
    const METHODS: &[&str] = &["get", "put", "post", "delete", "options", "head", "patch", "trace"];

    fn document() -> Value {
        serde_json::from_str(DOCUMENT).expect("host/openapi.json is JSON")
    }

    /// A route's pattern as an OpenAPI path: `{*key}` (the rest of the path)
    /// is written `{key}`, since OpenAPI has no rest parameter.
    fn openapi_path(pattern: &str) -> String {
        pattern.replace("{*", "{")
    }

    /// A concrete path for an OpenAPI path: each parameter replaced by an
    /// example value of its own, so that the matched parameters can be told
    /// apart.
    fn example_path(path: &str) -> (String, Vec<(String, String)>) {
        let mut params = Vec::new();
        let segments: Vec<String> = path
            .split('/')
            .map(|segment| match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) => {
                    let value = format!("example-{}", params.len());
                    params.push((name.to_owned(), value.clone()));
                    value
                }
                None => segment.to_owned(),
            })
            .collect();
        (segments.join("/"), params)
    }

    #[test]
    fn every_route_is_described_with_its_method() {
        let document = document();
        let paths = document["paths"].as_object().expect("the document has paths");
        for route in ROUTES {
            let path = openapi_path(route.pattern);
            let method = route.method.as_str().to_ascii_lowercase();
            let operation = paths.get(&path).and_then(|item| item.get(&method));
            assert!(operation.is_some(), "{} {} is not in host/openapi.json", route.method, path);
            let responses = operation.and_then(|op| op.get("responses")).and_then(Value::as_object);
            assert!(responses.is_some_and(|r| !r.is_empty()), "{} {path} describes no responses", route.method);
        }
    }

    #[test]
    fn every_described_operation_is_routed_to_its_route() {
        let document = document();
        let paths = document["paths"].as_object().expect("the document has paths");
        let mut operations = 0;
        for (path, item) in paths {
            let item = item.as_object().expect("a path item is an object");
            for method in item.keys().filter(|key| METHODS.contains(&key.as_str())) {
                operations += 1;
                let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).expect("an HTTP method");
                let declared = ROUTES
                    .iter()
                    .find(|route| route.method == method && openapi_path(route.pattern) == *path)
                    .unwrap_or_else(|| panic!("{method} {path} is described but has no route"));
                let (concrete, params) = example_path(path);
                let matched = router::route(ROUTES, &method, &concrete).unwrap_or_else(|e| panic!("{method} {concrete}: {e:?}"));
                assert!(std::ptr::eq(matched.route, declared), "{method} {concrete} reaches another route");
                for (name, value) in &params {
                    assert_eq!(matched.param(name), value, "{method} {path}: parameter {name}");
                }
            }
        }
        assert_eq!(operations, ROUTES.len(), "host/openapi.json describes another number of operations than ROUTES holds");
    }

    #[test]
    fn every_reference_resolves() {
        fn walk(value: &Value, document: &Value) {
            match value {
                Value::Object(fields) => {
                    if let Some(Value::String(reference)) = fields.get("$ref") {
                        let pointer = reference.strip_prefix('#').unwrap_or_else(|| panic!("{reference}: not local"));
                        assert!(document.pointer(pointer).is_some(), "{reference} resolves to nothing");
                    }
                    fields.values().for_each(|v| walk(v, document));
                }
                Value::Array(items) => items.iter().for_each(|v| walk(v, document)),
                _ => {}
            }
        }
        let document = document();
        assert!(document["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")), "an OpenAPI 3.1 document");
        walk(&document, &document);
    }
}
