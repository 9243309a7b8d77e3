//! The one workload every system of the `peers` benchmark gets: requests
//! of `size` messages of about 100 bytes to one random partition, a tenth of
//! them (by default) redeliveries of an earlier request of the same
//! connection, byte for byte; and what came back, tallied.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use stile_tests::gateway::Client;

use super::jetstream;

/// Every message's payload: 104 bytes of JSON.
pub const PAYLOAD: &str =
    r#"{"order":100123,"line":1,"amount":99.5,"currency":"EUR","sku":"SKU-000123-XL-BLUE","note":"leave at the door"}"#;

/// Requests a connection remembers for redeliveries.
const HISTORY: usize = 64;

/// How a connection reaches its system.
#[derive(Debug)]
pub enum Transport {
    /// stile, or a peer endpoint: `POST /api/v1/push` with the gateway's body.
    Http { client: Client, queue: Arc<str> },
    /// NATS JetStream: a publish per message, every ack awaited.
    Nats { context: async_nats::jetstream::Context, subjects: Arc<[String]> },
}

/// One request: `size` messages with ids `{tag}-{seq}-{i}`, to a partition.
#[derive(Clone, Debug)]
pub struct Request {
    pub tag: Arc<str>,
    pub seq: u64,
    pub partition: usize,
    pub size: u32,
}

impl Request {
    /// The transactionIds of its messages.
    pub fn ids(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.size).map(move |i| format!("{}-{}-{i}", self.tag, self.seq))
    }

    fn http_body(&self, queue: &str) -> Bytes {
        use std::fmt::Write as _;
        let mut body = String::with_capacity(64 + self.size as usize * (PAYLOAD.len() + 96));
        crate::write_items(&mut body, queue, self.partition, self.size as usize, |body, i| {
            let _ = write!(body, r#""transactionId":"{}-{}-{i}","payload":{PAYLOAD}"#, self.tag, self.seq);
        });
        Bytes::from(body)
    }
}

impl Transport {
    /// Sends `request` and returns, for each message, whether the system
    /// took it as new.
    pub async fn send(&mut self, request: &Request) -> anyhow::Result<Vec<bool>> {
        match self {
            Transport::Http { client, queue } => {
                let reply = client
                    .send(Method::POST, "/api/v1/push", request.http_body(queue), &[("content-type", "application/json")])
                    .await?;
                anyhow::ensure!(reply.status == 201, "HTTP {}: {}", reply.status, reply.text());
                let text = std::str::from_utf8(&reply.body)?;
                // Both the gateway and the peer endpoints answer with one
                // result object per item, in order, each with a status.
                let verdicts: Vec<bool> = text
                    .match_indices(r#""status":""#)
                    .map(|(at, prefix)| text[at + prefix.len()..].starts_with("queued"))
                    .collect();
                anyhow::ensure!(verdicts.len() == request.size as usize, "{} answers to {} items", verdicts.len(), request.size);
                Ok(verdicts)
            }
            Transport::Nats { context, subjects } => {
                let ids: Vec<String> = request.ids().collect();
                let payload = Bytes::from_static(PAYLOAD.as_bytes());
                Ok(jetstream::publish(context, &subjects[request.partition], &ids, &payload)
                    .await
                    .map_err(|e| anyhow::anyhow!(e))?)
            }
        }
    }
}

/// What one connection does.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Names the connection: prefixes its ids and seeds its choices.
    pub tag: Arc<str>,
    pub partitions: usize,
    pub size: u32,
    pub redelivery_percent: u32,
    /// Requests sent from here on and answered by `end` count.
    pub measure_from: Instant,
    pub end: Instant,
}

/// What one or more connections saw.
#[derive(Debug, Default)]
pub struct Tally {
    /// Messages answered in the measured interval, redeliveries included.
    pub messages: u64,
    pub requests: u64,
    /// Answers that were not what the workload makes them: a fresh message
    /// not new, or a redelivered one new.
    pub wrong: u64,
    pub errors: u64,
    pub latencies_us: Vec<u32>,
    /// Every request answered, measured or not: all of their messages are
    /// acknowledged as stored.
    pub acked: Vec<Request>,
}

impl Tally {
    pub fn merge(&mut self, other: Tally) {
        self.messages += other.messages;
        self.requests += other.requests;
        self.wrong += other.wrong;
        self.errors += other.errors;
        self.latencies_us.extend(other.latencies_us);
        self.acked.extend(other.acked);
    }

    /// The request latency at percentile `p`, in milliseconds.
    pub fn percentile_ms(&mut self, p: f64) -> f64 {
        self.latencies_us.sort_unstable();
        crate::percentile_ms(&self.latencies_us, p)
    }
}

/// One connection's loop until `plan.end`.
pub async fn connection(mut transport: Transport, plan: Plan) -> Tally {
    let mut rng = SmallRng::seed_from_u64(plan.tag.bytes().fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))));
    let mut history: Vec<Request> = Vec::with_capacity(HISTORY);
    let mut tally = Tally::default();
    let mut seq = 0;
    loop {
        let sent = Instant::now();
        if sent >= plan.end {
            return tally;
        }
        let redelivery = !history.is_empty() && rng.random_range(0..100) < plan.redelivery_percent;
        let request = if redelivery {
            history[rng.random_range(0..history.len())].clone()
        } else {
            seq += 1;
            Request { tag: plan.tag.clone(), seq, partition: rng.random_range(0..plan.partitions), size: plan.size }
        };
        let answer = transport.send(&request).await;
        let done = Instant::now();
        let verdicts = match answer {
            Ok(verdicts) => verdicts,
            Err(error) => {
                tally.errors += 1;
                if tally.errors <= 3 {
                    eprintln!("  {}: {error:#}", plan.tag);
                }
                continue;
            }
        };
        tally.acked.push(request.clone());
        if !redelivery {
            if history.len() < HISTORY {
                history.push(request);
            } else {
                history[rng.random_range(0..HISTORY)] = request;
            }
        }
        // Every answer is checked, the warm-up's too; only the measured
        // slice counts towards the rate and the latencies.
        tally.wrong += verdicts.iter().filter(|&&new| new == redelivery).count() as u64;
        if sent < plan.measure_from || done > plan.end {
            continue;
        }
        tally.requests += 1;
        tally.messages += verdicts.len() as u64;
        tally.latencies_us.push(u32::try_from(done.duration_since(sent).as_micros()).unwrap_or(u32::MAX));
    }
}

/// Fills a system's window: `per_partition` fresh messages in each of
/// `partitions`, in requests of `batch`, over `connections` at once; ids
/// `{tag}-{seq}-{i}`. Returns what was acknowledged.
pub async fn fill(transports: Vec<Transport>, tag: &str, partitions: usize, per_partition: usize, batch: u32) -> Tally {
    let requests_per_partition = per_partition.div_ceil(batch as usize);
    let mut all: Vec<Request> = Vec::with_capacity(partitions * requests_per_partition);
    let tag: Arc<str> = Arc::from(tag);
    for r in 0..requests_per_partition {
        // The last request of each partition takes what is left.
        let size = batch.min(u32::try_from(per_partition - r * batch as usize).expect("a batch fits u32"));
        for partition in 0..partitions {
            let seq = (r * partitions + partition) as u64;
            all.push(Request { tag: tag.clone(), seq, partition, size });
        }
    }
    let connections = transports.len();
    let mut tasks = Vec::with_capacity(connections);
    for (k, mut transport) in transports.into_iter().enumerate() {
        let mine: Vec<Request> = all.iter().skip(k).step_by(connections).cloned().collect();
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            for request in mine {
                let verdicts = transport.send(&request).await.unwrap_or_else(|e| panic!("fill {}: {e:#}", request.tag));
                assert!(verdicts.iter().all(|&new| new), "the fill's ids are new");
                tally.messages += verdicts.len() as u64;
                tally.acked.push(request);
            }
            tally
        }));
    }
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.expect("a fill connection"));
    }
    tally
}

/// How long one measurement runs.
#[derive(Clone, Copy, Debug)]
pub struct Slice {
    pub warmup: Duration,
    pub measured: Duration,
}
