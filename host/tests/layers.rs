//! The import rules of `host/src` (ARCHITECTURE.md, "Who may import
//! whom"), read from the source: a `crate::` path outside a file's tests
//! names the room it reaches, and each room may reach only the rooms its
//! rule lists. A room is a top-level module: a file of `host/src` or a
//! folder.
//!
//! The rules, from the wire inwards:
//! - `http/` reaches no feature, except its route table (`http/routes.rs`);
//! - a feature reaches `http/` only for its `call` ([`Call`]), `reply` and
//!   `query`, and another feature only where its rule names it;
//! - the core (gateway, shard, fusion, cache, wasm, component) reaches no
//!   feature but the push's item, and neither `http/` nor `server/`;
//! - `db/` reaches no feature and nothing above it;
//! - only `db/`, a feature's `sql.rs`, `payload_sql.rs` and `gateway.rs`
//!   (which runs a push inside a caller's transaction) use a PostgreSQL
//!   client crate;
//! - the core, `server/` and `db/` know no JSON, except `db/packed.rs`,
//!   which packs a segment's texts into the arrays the push function takes.
//!
//! [`Call`]: stile::http::Call

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The features: each a folder holding its parse, run, SQL and handlers.
const FEATURES: &[&str] = &["configure", "kv", "push", "reads", "service", "timers", "transaction"];

/// The leaves every room may reach: vocabulary without behaviour of its own.
const LEAVES: &[&str] = &["api", "hash", "json_string", "log_limit", "message_id", "payload", "payload_sql"];

/// The core of the push path, below the features.
const CORE: &[&str] = &["cache", "component", "fusion", "gateway", "shard", "wasm"];

/// Which rooms a room may reach, beside itself and [`LEAVES`]. `None`: any.
fn allowed(room: &str) -> Option<&'static [&'static str]> {
    Some(match room {
        "lib" | "main" => return None,
        "server" => &["cache", "component", "db", "gateway", "http", "intake", "kv", "metrics", "shard", "timers", "wasm"],
        "http" => &["db", "gateway", "intake"],
        "transaction" => &["db", "gateway", "http", "kv", "push", "timers"],
        "timers" => &["db", "gateway", "http", "kv", "push"],
        "configure" | "kv" | "push" | "reads" | "service" => &["db", "gateway", "http", "intake", "metrics"],
        "gateway" => &["db", "fusion", "metrics", "push", "shard"],
        "shard" => &["cache", "db", "fusion", "metrics"],
        "cache" => &["wasm"],
        "metrics" => &["db", "intake"],
        "db" | "fusion" | "wasm" | "component" | "intake" => &[],
        _ if LEAVES.contains(&room) => &[],
        other => panic!("host/src/{other}: a room without a rule; give it one in host/tests/layers.rs and ARCHITECTURE.md"),
    })
}

/// One `crate::` path of a file: the room it reaches and the rest of it.
#[derive(Debug)]
struct Reach {
    line: usize,
    room: String,
    rest: String,
}

#[derive(Debug)]
struct SourceFile {
    /// The path under `host/src`, with `/`.
    path: String,
    room: String,
    /// The lines before the file's tests.
    text: String,
}

impl SourceFile {
    /// Every `crate::` path of the file, groups (`crate::{a, b::{c, d}}`,
    /// over several lines too) taken member by member.
    fn reaches(&self) -> Vec<Reach> {
        let code = without_comments(&self.text);
        let mut reaches = Vec::new();
        let mut from = 0;
        while let Some(at) = code[from..].find("crate::") {
            let start = from + at + "crate::".len();
            let line = code[..start].matches('\n').count() + 1;
            for path in crate_paths(&code[start..]) {
                let (room, tail) = path.split_once("::").unwrap_or((&path, ""));
                reaches.push(Reach { line, room: room.to_owned(), rest: tail.to_owned() });
            }
            from = start;
        }
        reaches
    }

    fn uses_crate(&self, name: &str) -> bool {
        let code = without_comments(&self.text);
        code.contains(&format!("{name}::")) || code.contains(&format!("use {name};"))
    }
}

/// `text` with each `//` comment blanked to its line's end, lines kept.
fn without_comments(text: &str) -> String {
    text.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The paths a `crate::` starts: `a::b` for `crate::a::b`, and each member
/// of a group, `a` and `b::c` for `crate::{a, b::{c, d}}` (a member's own
/// group names its room once).
fn crate_paths(after: &str) -> Vec<String> {
    let Some(group) = after.strip_prefix('{') else { return vec![path_prefix(after)] };
    let mut members = Vec::new();
    let mut depth = 0usize;
    let mut member = String::new();
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                members.push(std::mem::take(&mut member));
                continue;
            }
            _ => {}
        }
        member.push(c);
    }
    members.push(member);
    members.iter().map(|member| path_prefix(member.trim())).filter(|path| !path.is_empty()).collect()
}

fn path_prefix(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
        .collect::<String>()
        .trim_end_matches(':')
        .to_owned()
}

fn sources() -> Vec<SourceFile> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut pending = vec![root.clone()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).expect("read host/src") {
            let path: PathBuf = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(&root).expect("under host/src").to_string_lossy().replace('\\', "/");
                let room = relative.split('/').next().expect("a first component").trim_end_matches(".rs").to_owned();
                let full = fs::read_to_string(&path).expect("read a source file");
                let text = match full.find("\n#[cfg(test)]") {
                    Some(at) => full[..at].to_owned(),
                    None => full,
                };
                files.push(SourceFile { path: relative, room, text });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    assert!(files.len() > 30, "host/src holds the gateway's sources");
    files
}

/// Why `reach` from `file` breaks a rule, if it does.
fn broken_rule(file: &SourceFile, reach: &Reach) -> Option<String> {
    let (from, to) = (file.room.as_str(), reach.room.as_str());
    let feature_to = FEATURES.contains(&to);
    if from == to || LEAVES.contains(&to) || (file.path == "http/routes.rs" && feature_to) {
        return None;
    }
    if let Some(rooms) = allowed(from)
        && !rooms.contains(&to)
    {
        return Some(format!("{from} may not reach {to}"));
    }
    if FEATURES.contains(&from) && to == "http" {
        let head = reach.rest.split("::").next().unwrap_or("");
        if !["call", "reply", "query"].contains(&head) {
            return Some(format!("a feature reaches http only for call, reply and query, not {head}"));
        }
    }
    if CORE.contains(&from) && to == "push" && !reach.rest.starts_with("item") {
        return Some("the core reaches the push only for its item".into());
    }
    None
}

#[test]
fn every_room_reaches_only_what_its_rule_allows() {
    let mut broken = Vec::new();
    for file in sources() {
        allowed(&file.room);
        for reach in file.reaches() {
            if let Some(rule) = broken_rule(&file, &reach) {
                broken.push(format!("host/src/{}:{}: crate::{}::{} ({rule})", file.path, reach.line, reach.room, reach.rest));
            }
        }
    }
    assert!(broken.is_empty(), "imports that break ARCHITECTURE.md's rules:\n{}", broken.join("\n"));
}

#[test]
fn only_the_storage_layer_and_sql_files_use_a_postgresql_client() {
    let talks_sql = |file: &SourceFile| {
        file.room == "db"
            || file.path.ends_with("/sql.rs")
            || file.path == "payload_sql.rs"
            || file.path == "gateway.rs"
            || file.path == "main.rs"
    };
    let offenders: Vec<String> = sources()
        .into_iter()
        .filter(|file| !talks_sql(file))
        .filter(|file| ["tokio_postgres", "deadpool_postgres", "postgres_types"].iter().any(|name| file.uses_crate(name)))
        .map(|file| file.path)
        .collect();
    assert!(offenders.is_empty(), "PostgreSQL client crates used outside db/ and the sql.rs files: {offenders:?}");
}

#[test]
fn the_core_and_the_storage_layer_know_no_json() {
    let offenders: Vec<String> = sources()
        .into_iter()
        .filter(|file| CORE.contains(&file.room.as_str()) || file.room == "db" || file.room == "server")
        .filter(|file| file.path != "db/packed.rs")
        .filter(|file| file.uses_crate("serde_json"))
        .map(|file| file.path)
        .collect();
    assert!(offenders.is_empty(), "serde_json used by the core or the storage layer: {offenders:?}");
}

/// The reader above must see what it checks: a rule it could not see broken
/// would pass whatever the code does.
#[test]
fn the_reader_finds_grouped_and_nested_paths() {
    let file = SourceFile {
        path: "http/mod.rs".into(),
        room: "http".into(),
        text: "use crate::{kv, push::body};\nlet x = crate::timers::route::list; // crate::reads\nuse crate::{\n    reads::{route, sql},\n    service,\n};\n".into(),
    };
    let reaches: BTreeSet<(String, String)> = file.reaches().into_iter().map(|r| (r.room, r.rest)).collect();
    let expected: BTreeSet<(String, String)> =
        [("kv", ""), ("push", "body"), ("reads", ""), ("service", ""), ("timers", "route::list")]
            .iter()
            .map(|(a, b)| ((*a).into(), (*b).into()))
            .collect();
    assert_eq!(reaches, expected);
    let broken: Vec<Option<String>> = file.reaches().iter().map(|reach| broken_rule(&file, reach)).collect();
    assert!(broken.iter().all(Option::is_some), "http/mod.rs may not name a feature: {broken:?}");
    let routes = SourceFile { path: "http/routes.rs".into(), ..file };
    assert!(routes.reaches().iter().all(|reach| broken_rule(&routes, reach).is_none()));
}
