//! The producers: what each sends, to which gateway, and how it retries.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hyper::Method;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};
use uuid::Uuid;

use super::{AddressBook, Attempt, Config, Item, ItemAnswer, Kind, Outcome, Request, Status, now_us};
use crate::gateway::Client;

pub(super) async fn produce(producer: usize, config: &Config, book: &AddressBook, t0: Instant, end: Instant) -> Vec<Request> {
    let mut rng = StdRng::seed_from_u64(config.seed ^ (producer as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut clients: Vec<Option<(u32, Client)>> = (0..config.gateways.len()).map(|_| None).collect();
    let mut requests = Vec::new();
    let mut next_new: u64 = 0;
    // The partition of each of this producer's ids, fixed when it is minted.
    let mut own_partitions: Vec<String> = Vec::new();
    let interval = if config.rate > 0.0 { Duration::from_secs_f64(1.0 / config.rate) } else { Duration::ZERO };
    let mut next_at = Instant::now();
    for seq in 0..config.max_requests as u64 {
        if Instant::now() >= end {
            break;
        }
        if !interval.is_zero() {
            tokio::time::sleep_until(next_at.into()).await;
            // A stall (a retried request) is not made up for with a burst.
            next_at = (next_at + interval).max(Instant::now());
        }
        let count = rng.random_range(1..=config.max_batch);
        let mut items: Vec<Item> = Vec::with_capacity(count);
        for _ in 0..count {
            let roll = rng.random_range(0..100u32);
            let now = t0.elapsed();
            let (txn, kind) = if roll < config.repeat_percent && (next_new > 0 || !items.is_empty()) {
                if !items.is_empty() && (next_new == 0 || rng.random_bool(0.1)) {
                    // The same id twice in one request.
                    let earlier = items[rng.random_range(0..items.len())].clone();
                    items.push(Item { kind: Kind::Repeat, ..earlier });
                    continue;
                } else {
                    // Mostly recent ids (a producer's retry logic), sometimes any.
                    let n = if rng.random_bool(0.8) {
                        next_new - 1 - rng.random_range(0..next_new.min(64))
                    } else {
                        rng.random_range(0..next_new)
                    };
                    let partition = own_partitions[n as usize].clone();
                    items.push(Item { txn: format!("p{producer}-{n}"), partition, kind: Kind::Repeat });
                    continue;
                }
            } else if roll < config.repeat_percent + config.shared_percent {
                // Producers pushing at about the same time pick from the same few.
                let slot = now.as_millis() / 500;
                (format!("s-{slot}-{}", rng.random_range(0..4)), Kind::Shared)
            } else {
                next_new += 1;
                (format!("p{producer}-{}", next_new - 1), Kind::New)
            };
            // Shared ids are placed by the time their slot names, so that
            // every producer places one the same way.
            let minted_at = match kind {
                Kind::Shared => Duration::from_millis(500 * (now.as_millis() / 500) as u64),
                _ => now,
            };
            let partition = partition_of(&txn, minted_at, config);
            if kind == Kind::New {
                own_partitions.push(partition.clone());
            }
            items.push(Item { txn, partition, kind });
        }
        let mut request = Request { producer, seq, items, attempts: Vec::new() };
        send(&mut request, config, book, &mut clients, &mut rng).await;
        requests.push(request);
    }
    requests
}

/// A retry storm: a producer that sends new ids of its own for the first
/// third of the run, then re-sends them, without pausing, until the run
/// ends: every other request replays the next ids in the order they were
/// first sent, the others ids picked at random, so that the gateways answer
/// replays of stored ids at full speed, recent and old, while the faults
/// run. Its producer number is `config.producers + 1 + storm` (after the
/// probes'); a replay is a `Kind::Repeat`, held to its original by the same
/// checks as every other answer.
pub(super) async fn storm(storm: usize, config: &Config, book: &AddressBook, t0: Instant, end: Instant) -> Vec<Request> {
    let producer = config.producers + 1 + storm;
    let mut rng = StdRng::seed_from_u64(config.seed ^ 0x5702_3000 ^ (storm as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut clients: Vec<Option<(u32, Client)>> = (0..config.gateways.len()).map(|_| None).collect();
    let mut requests = Vec::new();
    let mut sent: Vec<Item> = Vec::new();
    let replay_from = t0 + (end - t0) / 3;
    let mut cursor = 0usize;
    for seq in 0u64.. {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let count = rng.random_range(1..=config.max_batch);
        let items: Vec<Item> = if now < replay_from || sent.is_empty() {
            (0..count)
                .map(|_| {
                    let txn = format!("p{producer}-{}", sent.len());
                    let item = Item { partition: partition_of(&txn, t0.elapsed(), config), txn, kind: Kind::New };
                    sent.push(item.clone());
                    item
                })
                .collect()
        } else {
            let in_order = seq % 2 == 0;
            let mut picked: Vec<Item> = Vec::with_capacity(count);
            for _ in 0..count {
                let at = if in_order {
                    cursor = (cursor + 1) % sent.len();
                    cursor
                } else {
                    rng.random_range(0..sent.len())
                };
                // An id once per request: a request's repeats follow its first.
                if !picked.iter().any(|item| item.txn == sent[at].txn) {
                    picked.push(Item { kind: Kind::Repeat, ..sent[at].clone() });
                }
            }
            picked
        };
        let mut request = Request { producer, seq, items, attempts: Vec::new() };
        send(&mut request, config, book, &mut clients, &mut rng).await;
        requests.push(request);
    }
    requests
}

/// Probes: single-item pushes with ids of their own (`probe-{n}`), sent
/// open-loop at `config.probe_rate` a second, round robin over every
/// partition, each request on a task and connections of its own, so that a
/// partition that stalls holds up its own probes only. They show, partition
/// by partition, what kept flowing while a fault held some back (the
/// producers above wait for each answer, so a stall stops them whole).
/// Their producer number is `config.producers`.
pub(super) async fn probe(config: &Config, book: &AddressBook, end: Instant) -> Vec<Request> {
    let producer = config.producers;
    let interval = Duration::from_secs_f64(1.0 / config.probe_rate);
    let mut tasks = Vec::new();
    let mut next_at = Instant::now();
    for seq in 0u64.. {
        tokio::time::sleep_until(next_at.into()).await;
        next_at += interval;
        if Instant::now() >= end {
            break;
        }
        let item = Item {
            txn: format!("probe-{seq}"),
            partition: format!("part-{}", seq % config.partitions.max(1) as u64),
            kind: Kind::New,
        };
        let mut request = Request { producer, seq, items: vec![item], attempts: Vec::new() };
        let (config, book) = (config.clone(), book.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(config.seed ^ 0x0091_20be ^ seq);
            let mut clients: Vec<Option<(u32, Client)>> = (0..config.gateways.len()).map(|_| None).collect();
            send(&mut request, &config, &book, &mut clients, &mut rng).await;
            request
        }));
    }
    let mut requests = Vec::with_capacity(tasks.len());
    for task in tasks {
        if let Ok(request) = task.await {
            requests.push(request);
        }
    }
    requests
}

/// A new id's partition, in the hot group of the time it is minted at; the
/// id keeps it for good.
pub(super) fn partition_of(txn: &str, minted_at: Duration, config: &Config) -> String {
    let hash = xxhash_rust::xxh3::xxh3_64(txn.as_bytes()) as usize;
    let partitions = config.partitions.max(1);
    let hot = config.hot_partitions.min(partitions);
    if hot == 0 || config.hot_phase.is_zero() {
        return format!("part-{}", hash % partitions);
    }
    let groups = partitions / hot;
    let group = (minted_at.as_millis() / config.hot_phase.as_millis()) as usize % groups;
    format!("part-{}", group * hot + hash % hot)
}

/// The pause before a retry: 50 ms doubling to 1 s, plus up to half of it
/// again at random, never past the request's deadline.
struct Backoff {
    delay: Duration,
    deadline: Instant,
}

impl Backoff {
    fn new(deadline: Instant) -> Backoff {
        Backoff { delay: Duration::from_millis(50), deadline }
    }

    async fn wait(&mut self, rng: &mut StdRng) {
        let jitter = Duration::from_millis(rng.random_range(0..=self.delay.as_millis() as u64 / 2));
        tokio::time::sleep((self.delay + jitter).min(self.deadline.saturating_duration_since(Instant::now()))).await;
        self.delay = (self.delay * 2).min(Duration::from_secs(1));
    }
}

/// Sends one push until it is answered, refused for good, or given up.
pub(super) async fn send(
    request: &mut Request,
    config: &Config,
    book: &AddressBook,
    clients: &mut [Option<(u32, Client)>],
    rng: &mut StdRng,
) {
    let (producer, seq, items) = (request.producer, request.seq, &request.items);
    let attempts = &mut request.attempts;
    let body = |attempt: u32| {
        json!({
            "items": items.iter().map(|item| json!({
                "queue": config.queue,
                "partition": item.partition,
                "transactionId": item.txn,
                "payload": { "c": [producer, seq, attempt] },
            })).collect::<Vec<_>>()
        })
        .to_string()
    };
    let record = |attempted: Attempted| {
        let outcome = match attempted.answer {
            Ok((201, text)) => parse_answer(&text, items, &config.queue),
            Ok((status, text)) => Outcome::Status(status, text),
            Err(Unanswered::Timeout) => Outcome::Timeout,
            Err(other) => Outcome::Connection(other.to_string()),
        };
        let Attempted { gateway, incarnation, sent_us, done_us, .. } = attempted;
        attempts.push(Attempt { gateway, incarnation, sent_us, done_us, outcome });
    };
    until_answered("/api/v1/push", config, book, clients, rng, body, record).await;
}

/// One attempt of a request: where it went, when, and what came back.
pub(super) struct Attempted {
    pub(super) gateway: usize,
    pub(super) incarnation: u32,
    pub(super) sent_us: i64,
    pub(super) done_us: i64,
    /// The status and body answered, or why none was.
    pub(super) answer: Result<(u16, String), Unanswered>,
}

/// Why an attempt got no answer.
pub(super) enum Unanswered {
    /// The gateway it was sent to was down.
    Down,
    /// The connection failed.
    Connection(String),
    /// No answer within the attempt's time limit.
    Timeout,
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::Down => f.write_str("the gateway is down"),
            Unanswered::Connection(error) => f.write_str(error),
            Unanswered::Timeout => f.write_str("timeout"),
        }
    }
}

/// The one retry loop of every client of the checker: sends `body(attempt)`
/// to `path` on a gateway picked at random until an answer other than a
/// 5xx comes back, the attempts run out or the request's deadline passes,
/// pausing between attempts ([`Backoff`]); `record` sees every attempt. A
/// connection that did not answer 2xx is not used again.
pub(super) async fn until_answered(
    path: &str,
    config: &Config,
    book: &AddressBook,
    clients: &mut [Option<(u32, Client)>],
    rng: &mut StdRng,
    mut body: impl FnMut(u32) -> String,
    mut record: impl FnMut(Attempted),
) {
    let deadline = Instant::now() + config.request_deadline;
    let mut backoff = Backoff::new(deadline);
    for attempt in 0..config.max_attempts {
        let gateway = rng.random_range(0..clients.len());
        let target = book.read().expect("not poisoned")[gateway];
        let sent_us = now_us();
        let (incarnation, answer) = match target {
            None => (0, Err(Unanswered::Down)),
            Some((addr, incarnation)) => {
                let exchange = exchange_at(&mut clients[gateway], addr, incarnation, path, body(attempt));
                let answer = match tokio::time::timeout(config.attempt_timeout, exchange).await {
                    Ok(Ok(answered)) => Ok(answered),
                    Ok(Err(error)) => Err(Unanswered::Connection(format!("{error:#}"))),
                    Err(_) => Err(Unanswered::Timeout),
                };
                if !matches!(answer, Ok((200..=299, _))) {
                    clients[gateway] = None;
                }
                (incarnation, answer)
            }
        };
        let retry = match &answer {
            Ok((status, _)) => *status >= 500,
            Err(_) => true,
        };
        record(Attempted { gateway, incarnation, sent_us, done_us: now_us(), answer });
        if !retry || Instant::now() >= deadline {
            return;
        }
        backoff.wait(rng).await;
    }
}

/// One POST to `path` on a gateway's incarnation, on a connection kept per
/// incarnation.
async fn exchange_at(
    slot: &mut Option<(u32, Client)>,
    addr: SocketAddr,
    incarnation: u32,
    path: &str,
    body: String,
) -> anyhow::Result<(u16, String)> {
    if slot.as_ref().is_none_or(|(i, _)| *i != incarnation) {
        *slot = Some((incarnation, Client::connect(addr).await?));
    }
    let (_, client) = slot.as_mut().expect("just connected");
    let reply = client.send(Method::POST, path, body, &[("content-type", "application/json")]).await?;
    Ok((reply.status, reply.text()))
}

/// Parses a 201 body and checks its shape against the request.
pub(super) fn parse_answer(text: &str, items: &[Item], queue: &str) -> Outcome {
    let Ok(Value::Array(entries)) = serde_json::from_str::<Value>(text) else {
        return Outcome::Malformed(format!("not a JSON array: {text}"));
    };
    if entries.len() != items.len() {
        return Outcome::Malformed(format!("{} answers for {} items: {text}", entries.len(), items.len()));
    }
    let mut answers = Vec::with_capacity(items.len());
    for (index, (entry, item)) in entries.iter().zip(items).enumerate() {
        let status = match entry.get("status").and_then(Value::as_str) {
            Some("queued") => Status::Queued,
            Some("duplicate") => Status::Duplicate,
            _ => return Outcome::Malformed(format!("answer {index} has no known status: {entry}")),
        };
        let message_id = entry.get("message_id").and_then(Value::as_str).and_then(|s| Uuid::parse_str(s).ok());
        let offset = entry.get("offset").and_then(Value::as_i64);
        let (Some(message_id), Some(offset)) = (message_id, offset) else {
            return Outcome::Malformed(format!("answer {index} lacks a message id or an offset: {entry}"));
        };
        let echoes = entry.get("index").and_then(Value::as_u64) == Some(index as u64)
            && entry.get("transaction_id").and_then(Value::as_str) == Some(item.txn.as_str())
            && entry.get("queueName").and_then(Value::as_str) == Some(queue)
            && entry.get("partition").and_then(Value::as_str) == Some(item.partition.as_str());
        if !echoes || offset < 0 {
            return Outcome::Malformed(format!("answer {index} does not echo item {index} ({}): {entry}", item.txn));
        }
        answers.push(ItemAnswer { status, message_id, offset });
    }
    Outcome::Answered(answers)
}
