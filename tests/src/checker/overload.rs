//! The overload fault: for a spell, a flood of connections of the checker's
//! own sends large pushes to every gateway as fast as answers come, and
//! sends a push answered 503 again at once, while the producers keep going.
//! The gateways run with a small `--max-held-mb`, so that the flood fills
//! their intake and they shed.
//!
//! The flood pushes to a queue of its own (`{queue}-flood`), so that the
//! checks of the producers' queue see the producers' writes only. What the
//! gateways promise under overload is checked on the flood's answers as they
//! come: every answer is 201 or 503 (anything else, a push left unanswered
//! for [`FLOOD_PATIENCE`], or a connection that failed while its gateway was
//! up is a finding), and since every push carries ids of its own and is sent
//! again unchanged after a 503, a push answered 201 after being shed must
//! answer every item `queued`: a `duplicate` would mean that a shed push
//! wrote something. The producers' shed pushes are held to the same promise
//! by the checks (`checks::written_by_an_attempt_that_carried_it`).
//!
//! The flood runs on a thread and runtime of its own, so that building its
//! bodies does not delay the producers' tasks on the run's runtime.

use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use serde::Deserialize;
use tokio::sync::oneshot;

use super::db_faults::Spell;
use super::vitals::Latency;
use super::{AddressBook, Config, Outcome, Request, micros_of, now_us};
use crate::gateway::Client;

/// Partitions of the flood's queue for each gateway; a push's items are
/// spread over its gateway's. Each gateway has its own, so that the gateways
/// do not wait on each other's locks on them, and few, so that the flood
/// keeps to a few of each gateway's shards: every shard that works opens
/// connections of its own to PostgreSQL, and the run's gateways already hold
/// most of a default server's 100.
const FLOOD_PARTITIONS_PER_GATEWAY: usize = 4;

/// How long a flood push may go unanswered before it counts as a stall: past
/// the queue's time limit (5 s), the time a bundle takes under load and the
/// body's time limit (30 s, which only a slow client uses up).
const FLOOD_PATIENCE: Duration = Duration::from_secs(30);

/// How long after a spell ends the producers' failures still count as its
/// own: the requests that waited for room when it ended.
const SETTLE: Duration = Duration::from_secs(6);

/// Findings kept with their detail (every one is counted).
const FINDINGS_KEPT: usize = 20;

/// The flood: `connections` connections, spread round robin over the
/// gateways, each sending pushes of one of the sizes in `items` (round robin
/// too) with payloads of about `payload_bytes`, for the spell.
#[derive(Clone, Debug, PartialEq)]
pub struct OverloadFault {
    pub spell: Spell,
    pub connections: usize,
    /// Items per push, by connection: several sizes load the intake's two
    /// lanes (see [`OverloadFault::new`]).
    pub items: Vec<usize>,
    pub payload_bytes: usize,
    /// Every gateway's `--max-held-mb` for the whole run (it is a flag of the
    /// process, so it cannot change for the spell alone).
    pub max_held_mb: u64,
}

impl OverloadFault {
    /// 256 connections against gateways holding at most 8 MiB each, half
    /// of them pushing 1,000 items and half 250, of 100-byte payloads.
    ///
    /// A gateway charges three bytes per body byte and lets at most its
    /// budget hold and its budget wait; past that it sheds. A 1,000-item push
    /// (a body of about 190 KB) is charged about 560 KB, a 250-item one about
    /// 140 KB, so each gateway's 85 connections ask about 30 MB at once:
    /// more than the 16 MiB an 8 MiB budget holds and queues, whatever the
    /// machine's speed, while a 16 MiB budget (33.5 MB) takes them all in
    /// and only makes them wait. The 1,000-item push is a large request to
    /// the gateway, which keeps an eighth of its budget from large requests
    /// for small ones; the 250-item push (under 64 KiB) is small to it and
    /// takes that lane too, so that the producers' pushes meet a full intake.
    pub fn new(spell: Spell) -> OverloadFault {
        OverloadFault { spell, connections: 256, items: vec![1_000, 250], payload_bytes: 100, max_held_mb: 8 }
    }

    /// What the report's summary says about it.
    pub(super) fn describe(&self) -> String {
        let items: Vec<String> = self.items.iter().map(usize::to_string).collect();
        format!(
            "an overload from {:.0} s for {:.0} s ({} connections pushing [{}] items of {} bytes; --max-held-mb {})",
            self.spell.at.as_secs_f64(),
            self.spell.lasting.as_secs_f64(),
            self.connections,
            items.join(", "),
            self.payload_bytes,
            self.max_held_mb
        )
    }
}

/// The queue the flood pushes to.
pub(super) fn flood_queue(config: &Config) -> String {
    format!("{}-flood", config.queue)
}

/// Whether a 503's body says the gateway shed the request for want of room
/// (`stile::intake::Shed`, rendered as `body: …`): such a request was
/// refused before its body was read, so nothing of it may be stored. Other
/// 503s (the database unreachable, a partition locked) may follow a commit.
pub(super) fn is_shed(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|value| value.get("error")?.as_str().map(|error| error.starts_with("body: the gateway")))
        .unwrap_or(false)
}

/// A flood in progress.
#[derive(Debug)]
pub(super) struct Flood {
    stop: Arc<AtomicBool>,
    done: oneshot::Receiver<FloodTally>,
    pub(super) started_us: i64,
    pub(super) ended_us: Option<i64>,
}

impl Flood {
    /// Starts the flood's connections on a thread of their own.
    pub(super) fn start(fault: &OverloadFault, config: &Config, book: &AddressBook) -> anyhow::Result<Flood> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, done) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (fault, queue, book, flag) = (fault.clone(), flood_queue(config), book.clone(), stop.clone());
        let gateways = config.gateways.len();
        std::thread::Builder::new().name("checker-flood".to_owned()).spawn(move || {
            let tally = runtime.block_on(async move {
                let mut tasks = Vec::with_capacity(fault.connections);
                for connection in 0..fault.connections {
                    // Sizes go round robin over each gateway's connections,
                    // so that every gateway gets every size.
                    let gateway = connection % gateways.max(1);
                    let size = (connection / gateways.max(1)) % fault.items.len().max(1);
                    let shape = Shape { connection, gateway, items: fault.items[size], payload_bytes: fault.payload_bytes };
                    let (queue, book, stop) = (queue.clone(), book.clone(), flag.clone());
                    tasks.push(tokio::spawn(async move { flood_one(shape, &queue, &book, &stop).await }));
                }
                let mut tally = FloodTally::default();
                for task in tasks {
                    match task.await {
                        Ok(one) => tally.absorb(one),
                        Err(error) => tally.find(format!("a flood connection's task failed: {error}")),
                    }
                }
                tally
            });
            let _ = tx.send(tally);
        })?;
        Ok(Flood { stop, done, started_us: now_us(), ended_us: None })
    }

    /// Tells the connections to stop once their pushes in flight are
    /// answered.
    pub(super) fn stop(&mut self) {
        if self.ended_us.is_none() {
            self.stop.store(true, Ordering::Release);
            self.ended_us = Some(now_us());
        }
    }

    /// Stops the flood if it still runs and waits for its connections.
    pub(super) async fn finish(mut self) -> FloodTally {
        self.stop();
        self.done.await.unwrap_or_else(|_| {
            let mut tally = FloodTally::default();
            tally.find("the flood's thread ended without its tally".to_owned());
            tally
        })
    }
}

/// One flood connection's pushes.
#[derive(Clone, Copy, Debug)]
struct Shape {
    connection: usize,
    gateway: usize,
    items: usize,
    payload_bytes: usize,
}

/// What the flood's connections met.
#[derive(Debug, Default)]
pub(super) struct FloodTally {
    pushes: u64,
    created: u64,
    items_queued: u64,
    items_duplicate: u64,
    shed: u64,
    unavailable: u64,
    /// Pushes answered 201 after being shed at least once.
    created_after_shed: u64,
    /// Connections cut while their gateway was killed, and pushes refused
    /// while it was down: expected.
    cut_by_kills: u64,
    /// Every other outcome, each one a finding.
    other: std::collections::BTreeMap<String, u64>,
    findings: u64,
    finding_details: Vec<String>,
    created_us: Vec<i64>,
    refused_us: Vec<i64>,
}

impl FloodTally {
    fn find(&mut self, detail: String) {
        self.findings += 1;
        if self.finding_details.len() < FINDINGS_KEPT {
            self.finding_details.push(detail);
        }
    }

    fn other(&mut self, kind: &str, detail: String) {
        *self.other.entry(kind.to_owned()).or_insert(0) += 1;
        self.find(detail);
    }

    fn absorb(&mut self, one: FloodTally) {
        self.pushes += one.pushes;
        self.created += one.created;
        self.items_queued += one.items_queued;
        self.items_duplicate += one.items_duplicate;
        self.shed += one.shed;
        self.unavailable += one.unavailable;
        self.created_after_shed += one.created_after_shed;
        self.cut_by_kills += one.cut_by_kills;
        for (kind, n) in one.other {
            *self.other.entry(kind).or_insert(0) += n;
        }
        self.findings += one.findings;
        let room = FINDINGS_KEPT.saturating_sub(self.finding_details.len());
        self.finding_details.extend(one.finding_details.into_iter().take(room));
        self.created_us.extend(one.created_us);
        self.refused_us.extend(one.refused_us);
    }
}

/// One item of a 201, as far as the flood reads it.
#[derive(Deserialize)]
struct FloodAnswer {
    status: String,
}

/// How one attempt of a flood push ended, for its connection.
enum Next {
    /// Answered, or given up for good: send the next push.
    NextPush,
    /// Shed or refused for a while: send it again at once.
    Again { shed: bool },
}

/// One connection of the flood: pushes to its gateway until told to stop,
/// each sent again at once after a 503.
async fn flood_one(shape: Shape, queue: &str, book: &AddressBook, stop: &AtomicBool) -> FloodTally {
    let mut tally = FloodTally::default();
    let mut client: Option<(u32, Client)> = None;
    let mut seq = 0u64;
    while !stop.load(Ordering::Acquire) {
        let body = flood_body(queue, shape, seq);
        seq += 1;
        tally.pushes += 1;
        // Whether an earlier attempt was shed, and whether one may have
        // written (a 503 for the database may follow a commit): duplicates
        // in the 201 are a finding only after sheds alone.
        let mut shed_before = false;
        let mut written_before = false;
        loop {
            let Some((addr, incarnation)) = book.read().expect("not poisoned")[shape.gateway] else {
                // The gateway is down (killed); its restart takes about a
                // second. The push is sent again once it is back.
                if stop.load(Ordering::Acquire) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            if client.as_ref().is_none_or(|(i, _)| *i != incarnation) {
                client = match Client::connect(addr).await {
                    Ok(connected) => Some((incarnation, connected)),
                    Err(error) => {
                        if gateway_changed(book, shape.gateway, incarnation) {
                            tally.cut_by_kills += 1;
                        } else {
                            tally.other(
                                "connect",
                                format!("{}: could not connect to gateway {}: {error:#}", shape.label(seq), shape.gateway),
                            );
                        }
                        break;
                    }
                };
            }
            let (_, connected) = client.as_mut().expect("just connected");
            let sent = Instant::now();
            let attempt = connected.send(Method::POST, "/api/v1/push", body.clone(), &[("content-type", "application/json")]);
            let outcome = tokio::time::timeout(FLOOD_PATIENCE, attempt).await;
            let took_us = i64::try_from(sent.elapsed().as_micros()).unwrap_or(i64::MAX);
            let next = match outcome {
                Ok(Ok(reply)) => {
                    answered(reply.status, &reply.text(), took_us, shed_before && !written_before, shape, seq, &mut tally)
                }
                Ok(Err(error)) => {
                    client = None;
                    if gateway_changed(book, shape.gateway, incarnation) {
                        tally.cut_by_kills += 1;
                    } else {
                        tally.other(
                            "connection",
                            format!(
                                "{}: the connection failed while gateway {} was up: {error:#}",
                                shape.label(seq),
                                shape.gateway
                            ),
                        );
                    }
                    Next::NextPush
                }
                Err(_) => {
                    client = None;
                    tally.other(
                        "unanswered",
                        format!("{}: no answer from gateway {} within {FLOOD_PATIENCE:?}", shape.label(seq), shape.gateway),
                    );
                    Next::NextPush
                }
            };
            match next {
                Next::NextPush => break,
                Next::Again { shed } => {
                    shed_before |= shed;
                    written_before |= !shed;
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                }
            }
        }
    }
    tally
}

/// Counts one answer of a flood push and says what the connection does next.
fn answered(
    status: u16,
    text: &str,
    took_us: i64,
    only_shed_before: bool,
    shape: Shape,
    seq: u64,
    tally: &mut FloodTally,
) -> Next {
    match status {
        201 => {
            tally.created += 1;
            tally.created_us.push(took_us);
            let answers = match serde_json::from_str::<Vec<FloodAnswer>>(text) {
                Ok(answers) if answers.len() == shape.items => answers,
                Ok(answers) => {
                    tally.other(
                        "malformed-201",
                        format!("{}: {} answers to {} items", shape.label(seq), answers.len(), shape.items),
                    );
                    return Next::NextPush;
                }
                Err(error) => {
                    let start: String = text.chars().take(200).collect();
                    tally.other(
                        "malformed-201",
                        format!("{}: a 201 that is not a list of answers ({error}): {start}", shape.label(seq)),
                    );
                    return Next::NextPush;
                }
            };
            let duplicates = answers.iter().filter(|a| a.status == "duplicate").count() as u64;
            tally.items_duplicate += duplicates;
            tally.items_queued += answers.iter().filter(|a| a.status == "queued").count() as u64;
            if only_shed_before {
                tally.created_after_shed += 1;
                if duplicates > 0 {
                    tally.find(format!(
                        "{}: answered 201 after being shed with {duplicates} of {} items duplicate: a shed push wrote them",
                        shape.label(seq),
                        shape.items
                    ));
                }
            }
            Next::NextPush
        }
        503 if is_shed(text) => {
            tally.shed += 1;
            tally.refused_us.push(took_us);
            Next::Again { shed: true }
        }
        503 => {
            tally.unavailable += 1;
            tally.refused_us.push(took_us);
            // A 503 for the database may follow a commit: what the push
            // answers after it is not held to the shed's promise.
            Next::Again { shed: false }
        }
        other => {
            let start: String = text.chars().take(300).collect();
            tally.other(&other.to_string(), format!("{}: answered {other}: {start}", shape.label(seq)));
            Next::NextPush
        }
    }
}

impl Shape {
    fn label(&self, seq: u64) -> String {
        format!("flood connection {} push {seq} ({} items)", self.connection, self.items)
    }
}

fn gateway_changed(book: &AddressBook, gateway: usize, incarnation: u32) -> bool {
    book.read().expect("not poisoned")[gateway].is_none_or(|(_, now)| now != incarnation)
}

/// A push of ids no other push carries: `f{connection}-{push}-{item}`.
fn flood_body(queue: &str, shape: Shape, seq: u64) -> Bytes {
    // `{"f":"…"}` frames the filler with 8 bytes.
    let filler = "x".repeat(shape.payload_bytes.saturating_sub(8));
    let mut body = String::with_capacity(shape.items * (shape.payload_bytes + 100) + 16);
    body.push_str("{\"items\":[");
    for item in 0..shape.items {
        if item > 0 {
            body.push(',');
        }
        let partition = (shape.connection + item) % FLOOD_PARTITIONS_PER_GATEWAY;
        let _ = write!(
            body,
            r#"{{"queue":"{queue}","partition":"flood-{}-{partition}","transactionId":"f{}-{seq}-{item}","payload":{{"f":"{filler}"}}}}"#,
            shape.gateway, shape.connection
        );
    }
    body.push_str("]}");
    Bytes::from(body)
}

// ---------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------

/// What the overload spell did: the flood's answers, and the producers'
/// while it lasted.
#[derive(Clone, Debug, Default)]
pub struct OverloadReport {
    pub described: String,
    /// From the start of the push phase.
    pub from: Duration,
    pub to: Duration,
    /// Flood pushes begun, answered 201 (and their items' answers), answered
    /// 503 shed or 503 for the database (each answer, retries included), and
    /// answered 201 after being shed.
    pub flood_pushes: u64,
    pub flood_created: u64,
    pub flood_items_queued: u64,
    pub flood_items_duplicate: u64,
    pub flood_shed: u64,
    pub flood_unavailable: u64,
    pub flood_created_after_shed: u64,
    /// Connections cut by a gateway's kill, or refused while it restarted.
    pub flood_cut_by_kills: u64,
    /// Every other outcome, by kind; each is a finding.
    pub flood_other: std::collections::BTreeMap<String, u64>,
    pub flood_created_latency: Latency,
    pub flood_refused_latency: Latency,
    /// Everything the gateways should not have done: answers other than 201
    /// and 503, pushes left unanswered, connections failed while their
    /// gateway was up, a shed push that wrote. Counted, the first few shown.
    pub findings: u64,
    pub finding_details: Vec<String>,
    /// The producers' attempts that ended while the spell lasted (or within
    /// [`SETTLE`] after it): answered, shed, 503 for the database, timed out
    /// or failed to connect.
    pub producers_answered: u64,
    pub producers_shed: u64,
    pub producers_unavailable: u64,
    pub producers_timeouts: u64,
    pub producers_connection_errors: u64,
    /// The producers' answered attempts sent while the spell lasted.
    pub producers_latency: Latency,
}

impl OverloadReport {
    /// Sums up the flood and the producers' attempts around it.
    pub(super) fn of(
        described: String,
        flood: FloodTally,
        times: (i64, i64),
        requests: &[Request],
        t0: Instant,
    ) -> OverloadReport {
        let (start, end) = times;
        let t0_us = micros_of(t0);
        let since_t0 = |us: i64| Duration::from_micros(u64::try_from(us - t0_us).unwrap_or(0));
        let settled = end.saturating_add(i64::try_from(SETTLE.as_micros()).unwrap_or(i64::MAX));
        let mut report = OverloadReport {
            described,
            from: since_t0(start),
            to: since_t0(end),
            flood_pushes: flood.pushes,
            flood_created: flood.created,
            flood_items_queued: flood.items_queued,
            flood_items_duplicate: flood.items_duplicate,
            flood_shed: flood.shed,
            flood_unavailable: flood.unavailable,
            flood_created_after_shed: flood.created_after_shed,
            flood_cut_by_kills: flood.cut_by_kills,
            flood_other: flood.other,
            flood_created_latency: Latency::of(flood.created_us),
            flood_refused_latency: Latency::of(flood.refused_us),
            findings: flood.findings,
            finding_details: flood.finding_details,
            ..OverloadReport::default()
        };
        let mut latencies = Vec::new();
        for attempt in requests.iter().flat_map(|r| &r.attempts) {
            if matches!(attempt.outcome, Outcome::Answered(_)) && (start..=end).contains(&attempt.sent_us) {
                latencies.push(attempt.done_us - attempt.sent_us);
            }
            if !(start..=settled).contains(&attempt.done_us) {
                continue;
            }
            match &attempt.outcome {
                Outcome::Answered(_) => report.producers_answered += 1,
                Outcome::Status(503, body) if is_shed(body) => report.producers_shed += 1,
                Outcome::Status(503, _) => report.producers_unavailable += 1,
                Outcome::Timeout => report.producers_timeouts += 1,
                Outcome::Connection(_) => report.producers_connection_errors += 1,
                Outcome::Status(..) | Outcome::Malformed(_) => {}
            }
        }
        report.producers_latency = Latency::of(latencies);
        report
    }
}

impl fmt::Display for OverloadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let other: Vec<String> = self.flood_other.iter().map(|(kind, n)| format!("{n}x{kind}")).collect();
        writeln!(
            f,
            "overload: {} from {:.1} s to {:.1} s: the flood began {} pushes; answers 201: {} ({} items queued, {} duplicate; \
             {} of them after being shed), 503 shed: {}, 503 for the database: {}, other: [{}]; {} cut by gateway kills",
            self.described,
            self.from.as_secs_f64(),
            self.to.as_secs_f64(),
            self.flood_pushes,
            self.flood_created,
            self.flood_items_queued,
            self.flood_items_duplicate,
            self.flood_created_after_shed,
            self.flood_shed,
            self.flood_unavailable,
            other.join(", "),
            self.flood_cut_by_kills
        )?;
        writeln!(f, "  flood 201s: {}", self.flood_created_latency)?;
        writeln!(f, "  flood 503s: {}", self.flood_refused_latency)?;
        writeln!(
            f,
            "  producers' attempts ending during it (or {} s after): {} answered, {} answered 503 shed, {} 503 for the database, \
             {} timeouts, {} connection errors; answered attempts sent during it: {}",
            SETTLE.as_secs(),
            self.producers_answered,
            self.producers_shed,
            self.producers_unavailable,
            self.producers_timeouts,
            self.producers_connection_errors,
            self.producers_latency
        )?;
        write!(f, "  overload findings: {}", self.findings)?;
        for detail in &self.finding_details {
            write!(f, "\n  OVERLOAD FINDING: {detail}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shed_answers_are_told_from_other_503s() {
        assert!(is_shed(
            r#"{"error":"body: the gateway is at capacity and its backlog would not drain within the queue time limit; retry"}"#
        ));
        assert!(is_shed(r#"{"error":"body: the gateway had no room for this request within 5 s; retry"}"#));
        assert!(!is_shed(r#"{"error":"the database is unavailable; retry"}"#));
        assert!(!is_shed(r#"{"error":"the gateway has no room for an answer now; retry"}"#));
        assert!(!is_shed("not json"));
    }

    #[test]
    fn a_flood_body_carries_ids_of_its_own_and_payloads_of_the_size_asked() {
        let shape = Shape { connection: 3, gateway: 0, items: 250, payload_bytes: 100 };
        let body: serde_json::Value = serde_json::from_slice(&flood_body("q-flood", shape, 7)).expect("JSON");
        let items = body["items"].as_array().expect("items");
        assert_eq!(items.len(), 250);
        assert_eq!(items[0]["transactionId"], "f3-7-0");
        assert_eq!(items[249]["transactionId"], "f3-7-249");
        assert_eq!(items[0]["payload"].to_string().len(), 100);
        // Small to the gateway: a body under 64 KiB.
        assert!(flood_body("q-flood", shape, 7).len() < 64 << 10);
        let large = Shape { items: 1_000, ..shape };
        assert!(flood_body("q-flood", large, 7).len() > 64 << 10);
    }

    #[test]
    fn a_duplicate_after_a_shed_is_a_finding_and_other_statuses_are_too() {
        let shape = Shape { connection: 0, gateway: 0, items: 2, payload_bytes: 10 };
        let two = |a: &str, b: &str| format!(r#"[{{"status":"{a}"}},{{"status":"{b}"}}]"#);
        let mut tally = FloodTally::default();
        assert!(matches!(answered(201, &two("queued", "queued"), 1, true, shape, 0, &mut tally), Next::NextPush));
        assert_eq!((tally.created_after_shed, tally.findings), (1, 0));
        answered(201, &two("queued", "duplicate"), 1, false, shape, 1, &mut tally);
        assert_eq!(tally.findings, 0, "a duplicate without a shed before it is no finding");
        answered(201, &two("queued", "duplicate"), 1, true, shape, 2, &mut tally);
        assert_eq!(tally.findings, 1);
        let shed =
            r#"{"error":"body: the gateway is at capacity and its backlog would not drain within the queue time limit; retry"}"#;
        assert!(matches!(answered(503, shed, 1, false, shape, 3, &mut tally), Next::Again { shed: true }));
        assert!(matches!(answered(503, r#"{"error":"down"}"#, 1, false, shape, 3, &mut tally), Next::Again { shed: false }));
        answered(500, r#"{"error":"boom"}"#, 1, false, shape, 4, &mut tally);
        answered(201, "[]", 1, false, shape, 5, &mut tally);
        assert_eq!(tally.findings, 3);
        assert_eq!(tally.other.get("500"), Some(&1));
        assert_eq!(tally.other.get("malformed-201"), Some(&1));
        assert_eq!((tally.shed, tally.unavailable), (1, 1));
    }
}
