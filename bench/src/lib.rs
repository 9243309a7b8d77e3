//! What stile's benchmark programs (`load`, `storm`, `sql_bench`, `cache_bench`)
//! share: the forms their flags take, the median they report, the record of
//! the machine they ran on, and how a run stopped by hand ends.
//!
//! Their results, and the command that made each, are in `bench/<name>/RESULTS.md`.

use std::fmt::Write as _;
use std::future::Future;

pub mod peer_http;
pub mod peers;
pub mod pgbench;

use stile_tests::pg::unless_interrupted;

/// A fresh push request of the load generators: `size` items to partition
/// `p{partition}` of `queue`, transactionIds `{tag}-{seq}-{i}`, payloads of
/// about 60 bytes. Written into `body`, which is cleared first.
pub fn write_push_body(body: &mut String, queue: &str, partition: usize, tag: &str, seq: u64, size: usize) {
    write_items(body, queue, partition, size, |body, i| write_pushed_item(body, tag, seq, i));
}

/// A request re-sending items of earlier fresh requests to partition
/// `p{partition}` of `queue`: each `(tag, seq, i)` of `items` is item `i` of
/// the request [`write_push_body`] wrote with that `tag` and `seq`, byte for
/// byte (same transactionId, same payload). Written into `body`, which is
/// cleared first.
pub fn write_pushed_items(body: &mut String, queue: &str, partition: usize, items: &[(&str, u64, usize)]) {
    write_items(body, queue, partition, items.len(), |body, k| {
        let (tag, seq, i) = items[k];
        write_pushed_item(body, tag, seq, i);
    });
}

/// The `"transactionId"` and `"payload"` members of item `i` of the fresh
/// request `seq` of the connection `tag`.
fn write_pushed_item(body: &mut String, tag: &str, seq: u64, i: usize) {
    let _ = write!(
        body,
        r#""transactionId":"{tag}-{seq}-{i}","payload":{{"order":{seq},"line":{i},"amount":99.5,"currency":"EUR"}}"#
    );
}

/// A redelivery of stored messages: items of partition `p{partition}` of
/// `queue` whose transactionIds are `prefill-p{partition}-{i}` for each `i`
/// of `ids`, the ids the load generators prefill a window with. Written
/// into `body`, which is cleared first.
pub fn write_replay_body(body: &mut String, queue: &str, partition: usize, ids: &[usize]) {
    write_items(body, queue, partition, ids.len(), |body, k| {
        let i = ids[k];
        let _ = write!(
            body,
            r#""transactionId":"prefill-p{partition}-{i}","payload":{{"order":{i},"amount":99.5,"currency":"EUR"}}"#
        );
    });
}

/// A push body of `count` items to partition `p{partition}` of `queue`,
/// written into `body` (cleared first): `id_and_payload` writes the rest of
/// item `k`, its `"transactionId"` and `"payload"` members.
pub(crate) fn write_items(
    body: &mut String,
    queue: &str,
    partition: usize,
    count: usize,
    mut id_and_payload: impl FnMut(&mut String, usize),
) {
    body.clear();
    body.push_str(r#"{"items":["#);
    for k in 0..count {
        if k > 0 {
            body.push(',');
        }
        let _ = write!(body, r#"{{"queue":"{queue}","partition":"p{partition}","#);
        id_and_payload(body, k);
        body.push('}');
    }
    body.push_str("]}");
}

/// The latency at percentile `p` (nearest rank) of latencies in
/// microseconds sorted ascending, in milliseconds; NaN if there are none.
pub fn percentile_ms(sorted_us: &[u32], p: f64) -> f64 {
    debug_assert!(sorted_us.is_sorted(), "the latencies are sorted");
    let rank = ((p / 100.0) * sorted_us.len() as f64).ceil() as usize;
    sorted_us.get(rank.clamp(1, sorted_us.len().max(1)) - 1).map_or(f64::NAN, |&us| f64::from(us) / 1000.0)
}

/// A `--pg-set` value: a setting's name (lower-case letters, `_` and `.`,
/// as PostgreSQL's own and extensions' settings are named, which keeps it
/// safe to splice into `ALTER DATABASE`) and its value.
pub fn pg_setting(text: &str) -> Result<(String, String), String> {
    let (name, value) = text.split_once('=').ok_or_else(|| format!("NAME=VALUE, got {text:?}"))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c == '_' || c == '.') {
        return Err(format!("not a setting name: {name:?}"));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// The value of a flag that turns something off or on, written as the
/// results pages quote the commands (`--sync on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    Off,
    On,
}

impl Switch {
    pub fn is_on(self) -> bool {
        self == Switch::On
    }

    /// The flag's value as written, for a run's printed summary.
    pub fn name(self) -> &'static str {
        match self {
            Switch::Off => "off",
            Switch::On => "on",
        }
    }
}

/// Parses a whole number as the benchmarks' flags take it: `_` may group
/// its digits (`1_000_000`), and a number written in any form a float takes
/// counts if it is whole (`1e6`), since commands are typed by hand.
pub fn count<T: TryFrom<u64>>(text: &str) -> Result<T, String> {
    let digits = text.trim().replace('_', "");
    let n = match digits.parse::<u64>() {
        Ok(n) => n,
        Err(_) => match digits.parse::<f64>() {
            Ok(x) if x >= 0.0 && x.fract() == 0.0 && x < u64::MAX as f64 => x as u64,
            _ => return Err(format!("not a whole number: {text:?}")),
        },
    };
    T::try_from(n).map_err(|_| format!("too large: {text:?}"))
}

/// Parses a duration in seconds (`1.5`; `_` may group digits), which must
/// not be negative.
pub fn seconds(text: &str) -> Result<f64, String> {
    match text.trim().replace('_', "").parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Ok(secs),
        _ => Err(format!("not a number of seconds: {text:?}")),
    }
}

/// The median of the values that are not NaN, NaN if none is: a
/// measurement that did not run leaves a gap in a table, not a panic.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.into_iter().filter(|v| !v.is_nan()).collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The machine a run is measured on, as its printed summary records it:
/// the cores this process may use and the processor's model (Linux).
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| {
        info.lines().find_map(|line| line.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned()))
    });
    let memory = std::fs::read_to_string("/proc/meminfo").ok().and_then(|info| {
        let kib: u64 =
            info.lines().find_map(|line| line.strip_prefix("MemTotal:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(format!(", {:.0} GiB", kib as f64 / (1 << 20) as f64))
    });
    let memory = memory.unwrap_or_default();
    match model {
        Some(model) => format!("{cores} cores{memory}, {model}"),
        None => format!("{cores} cores{memory}"),
    }
}

/// Today's date, UTC (`2026-12-03`), so that a figure copied from a run's
/// summary carries the day it was measured on.
pub fn today() -> String {
    command_output("date", &["-u", "+%F"]).unwrap_or_else(|| "an unknown date".to_owned())
}

/// The build measured: the source tree's commit, marked `+changes` when the
/// tree differs from it, as `git` reports it for this crate's checkout.
pub fn build() -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let Some(commit) = command_output("git", &["-C", root, "rev-parse", "--short", "HEAD"]) else {
        return "an unknown build".to_owned();
    };
    let changed =
        command_output("git", &["-C", root, "status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    format!("the tree at {commit}{}", if changed { "+changes" } else { "" })
}

/// What `program args` prints, trimmed, if it runs and succeeds.
fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let output = std::process::Command::new(program).args(args).output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The 1, 5 and 15 minute load averages (Linux), for the record: the
/// figures mean little on a machine that was busy with something else.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The server's version, for a run's printed summary.
pub async fn server_version(client: &tokio_postgres::Client) -> String {
    client.query_one("SHOW server_version", &[]).await.expect("read the server's version").get("server_version")
}

/// Runs a benchmark on `runtime` to its end. Stopped by Ctrl-C or SIGTERM,
/// it drops `work`, and with it the database and gateway processes the run
/// owns, says so (`cleaned` is what was cleaned up) and exits 130, so that
/// a run stopped by hand leaves nothing behind.
pub fn run_to_end(program: &str, cleaned: &str, runtime: tokio::runtime::Runtime, work: impl Future<Output = ()>) {
    if !runtime.block_on(unless_interrupted(work)) {
        eprintln!("{program}: interrupted; {cleaned}");
        std::process::exit(130);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_bodies_are_the_json_the_gateway_takes() {
        let mut body = String::from("left over");
        write_push_body(&mut body, "q", 3, "t", 7, 2);
        assert_eq!(
            body,
            r#"{"items":[{"queue":"q","partition":"p3","transactionId":"t-7-0","payload":{"order":7,"line":0,"amount":99.5,"currency":"EUR"}},{"queue":"q","partition":"p3","transactionId":"t-7-1","payload":{"order":7,"line":1,"amount":99.5,"currency":"EUR"}}]}"#
        );
        write_replay_body(&mut body, "q", 3, &[5]);
        assert_eq!(
            body,
            r#"{"items":[{"queue":"q","partition":"p3","transactionId":"prefill-p3-5","payload":{"order":5,"amount":99.5,"currency":"EUR"}}]}"#
        );
        write_push_body(&mut body, "q", 0, "t", 0, 0);
        assert_eq!(body, r#"{"items":[]}"#);
    }

    #[test]
    fn pushed_items_are_sent_again_byte_for_byte() {
        let mut fresh = String::new();
        write_push_body(&mut fresh, "q", 3, "t", 7, 2);
        let mut again = String::new();
        write_pushed_items(&mut again, "q", 3, &[("t", 7, 0), ("t", 7, 1)]);
        assert_eq!(again, fresh);
        write_pushed_items(&mut again, "q", 3, &[("u", 2, 5)]);
        assert_eq!(
            again,
            r#"{"items":[{"queue":"q","partition":"p3","transactionId":"u-2-5","payload":{"order":2,"line":5,"amount":99.5,"currency":"EUR"}}]}"#
        );
    }

    #[test]
    fn settings_are_names_and_values() {
        assert_eq!(pg_setting("work_mem=8MB"), Ok(("work_mem".to_owned(), "8MB".to_owned())));
        assert_eq!(pg_setting("a.b=x=y"), Ok(("a.b".to_owned(), "x=y".to_owned())));
        assert!(pg_setting("work_mem").is_err());
        assert!(pg_setting("Work_mem=1").is_err());
        assert!(pg_setting("x;drop=1").is_err());
    }

    #[test]
    fn counts_take_grouped_digits_and_whole_floats() {
        assert_eq!(count::<usize>("1_000_000"), Ok(1_000_000));
        assert_eq!(count::<usize>("1e6"), Ok(1_000_000));
        assert_eq!(count::<u32>(" 10 "), Ok(10));
        assert!(count::<usize>("1.5").is_err());
        assert!(count::<usize>("-1").is_err());
        assert!(count::<u32>("5000000000").is_err());
        assert!(count::<usize>("").is_err());
    }

    #[test]
    fn seconds_are_not_negative() {
        assert_eq!(seconds("0.2"), Ok(0.2));
        assert_eq!(seconds("1_0"), Ok(10.0));
        assert!(seconds("-1").is_err());
        assert!(seconds("inf").is_err());
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let sorted: Vec<u32> = (1..=100).map(|ms| ms * 1000).collect();
        assert_eq!(percentile_ms(&sorted, 50.0), 50.0);
        assert_eq!(percentile_ms(&sorted, 99.0), 99.0);
        assert_eq!(percentile_ms(&sorted, 0.0), 1.0);
        assert_eq!(percentile_ms(&[2500], 99.0), 2.5);
        assert!(percentile_ms(&[], 50.0).is_nan());
    }

    #[test]
    fn the_median_skips_what_did_not_run() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0, f64::NAN, 2.0, 3.0]), 2.5);
        assert!(median([f64::NAN]).is_nan());
        assert!(median([]).is_nan());
    }
}
