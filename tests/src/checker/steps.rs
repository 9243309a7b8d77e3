//! Transactions and timers under the run's faults.
//!
//! A *step* is one such request as a client means it: a transaction or a
//! standalone timer schedule, with every attempt it took to be answered.
//! Each steps producer sends, in turn, a transaction (one push with an id of
//! its own, a `once` on a key of its own, and on every third a timer rider)
//! and a standalone timer schedule, each retried to another gateway on
//! timeouts, connection errors and 5xx until it is answered. Their queues keep
//! the long window (the run's window changes apply to the push queue only).
//!
//! What is checked, once the gateways are quiet and every due timer has had
//! time to fire:
//!
//! - a transaction is all or nothing: its push is stored (once) exactly when
//!   its key exists and its timer rider exists (pending or delivered);
//! - a transaction answered `success: true` is stored; one answered
//!   `duplicate` or `kv_precondition` was committed by an earlier attempt
//!   (its push is stored);
//! - every acknowledged timer, standalone or riding a committed transaction,
//!   was delivered exactly once and is no longer pending; an unacknowledged
//!   one at most once.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use base64::Engine as _;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};

use super::workload::{Attempted, until_answered};
use super::{AddressBook, Config, Report, Violation};
use crate::gateway::Client;

/// Steps of this many milliseconds at most pass between scheduling and due.
const MAX_DELAY_MS: u64 = 2_000;

/// What one step (a transaction or a timer schedule) asked for and how its
/// attempts ended.
#[derive(Clone, Debug)]
pub(super) struct Step {
    kind: StepKind,
    /// The push's transactionId and the once key (transactions), or the
    /// timer's txn (timers).
    id: String,
    /// The timer key and txn riding a transaction, if any.
    rider: Option<String>,
    /// The last answer: `committed`, `duplicate`, `kv_precondition`,
    /// `scheduled`, or how the last attempt failed.
    answer: String,
    attempts: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepKind {
    Transaction,
    Timer,
}

/// The steps' totals, for the report.
#[derive(Clone, Debug, Default)]
pub struct StepsReport {
    pub transactions: u64,
    pub committed: u64,
    /// Retried transactions that found their earlier attempt committed.
    pub answered_duplicate: u64,
    pub answered_precondition: u64,
    pub timers: u64,
    pub timers_delivered: u64,
    pub retries: u64,
    pub unanswered: u64,
}

impl fmt::Display for StepsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "steps: {} transactions ({} committed, {} retries found their commit: {} duplicate, {} kv_precondition), \
             {} timers scheduled, {} timer messages delivered, {} retries, {} unanswered",
            self.transactions,
            self.committed,
            self.answered_duplicate + self.answered_precondition,
            self.answered_duplicate,
            self.answered_precondition,
            self.timers,
            self.timers_delivered,
            self.retries,
            self.unanswered
        )
    }
}

/// A connection for the checks, tried for up to 30 s: the gateways, still
/// running, keep every connection their pools opened, which can be most of
/// a server's, and the server's other clients come and go.
async fn connect(database_url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let mut config = stile::db::DbConfig::parse(database_url).map_err(|e| anyhow!("{e}"))?;
    config.pg.connect_timeout(Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match crate::pg::connect(&config).await {
            Ok(client) => return Ok(client),
            Err(error) if Instant::now() >= deadline => return Err(anyhow!("connect to {database_url}: {error}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// The steps' queues and key namespace, beside the run's queue.
pub(super) fn tx_queue(config: &Config) -> String {
    format!("{}-steps", config.queue)
}

pub(super) fn timer_queue(config: &Config) -> String {
    format!("{}-timers", config.queue)
}

pub(super) async fn produce_steps(producer: usize, config: &Config, book: &AddressBook, end: Instant) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(config.seed ^ 0x57e9 ^ (producer as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut clients: Vec<Option<(u32, Client)>> = (0..config.gateways.len()).map(|_| None).collect();
    let mut steps = Vec::new();
    let interval = Duration::from_millis(50);
    for seq in 0.. {
        if Instant::now() >= end {
            break;
        }
        tokio::time::sleep(interval).await;
        let id = format!("s{producer}-{seq}");
        let delay = rng.random_range(0..=MAX_DELAY_MS) as i64 - 500;
        let payload = base64::engine::general_purpose::STANDARD.encode(json!({"step": id}).to_string());
        let (kind, rider, path, body) = if seq % 2 == 0 {
            let rider = (seq % 3 == 0).then(|| format!("r-{id}"));
            let mut body = json!({
                "operations": [{"type": "push", "items": [{"queue": tx_queue(config), "partition": format!("p{}", seq % 8),
                                                           "transactionId": id, "payload": {"step": id}}]}],
                "kv": [{"op": "putIfAbsent", "ns": "checker", "key": id, "value": true, "ttlSeconds": 86_400, "required": true}],
            });
            if let Some(rider) = &rider {
                body["timers"] = json!([{"op": "schedule", "queue": timer_queue(config), "timerKey": rider, "txn": rider,
                                         "delayMs": delay, "payload": payload}]);
            }
            (StepKind::Transaction, rider, "/api/v1/transaction", body)
        } else {
            let body = json!({"operations": [{"op": "schedule", "queue": timer_queue(config), "timerKey": id, "txn": id,
                                              "delayMs": delay, "payload": payload, "partition": format!("p{}", seq % 8)}]});
            (StepKind::Timer, None, "/api/v1/timers", body)
        };
        let mut step = Step { kind, id, rider, answer: String::new(), attempts: 0 };
        send_step(&mut step, path, body.to_string(), config, book, &mut clients, &mut rng).await;
        steps.push(step);
    }
    steps
}

async fn send_step(
    step: &mut Step,
    path: &str,
    body: String,
    config: &Config,
    book: &AddressBook,
    clients: &mut [Option<(u32, Client)>],
    rng: &mut StdRng,
) {
    let record = |attempted: Attempted| {
        step.attempts += 1;
        step.answer = match attempted.answer {
            Ok((200, text)) => {
                let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                match step.kind {
                    StepKind::Transaction if answer["success"] == json!(true) => "committed".to_owned(),
                    StepKind::Transaction => answer["reason"].as_str().unwrap_or("malformed").to_owned(),
                    StepKind::Timer if answer["results"][0]["ok"] == json!(true) => "scheduled".to_owned(),
                    StepKind::Timer => format!("malformed: {text}"),
                }
            }
            Ok((status, text)) => format!("{status}: {text}"),
            Err(unanswered) => unanswered.to_string(),
        };
    };
    until_answered(path, config, book, clients, rng, |_| body.clone(), record).await;
}

/// Waits, while the gateways still run, for every timer of the steps to be
/// due and fired (30 s at most after the last could be due).
pub(super) async fn wait_for_due_timers(database_url: &str, config: &Config) -> anyhow::Result<()> {
    let pg = connect(database_url).await?;
    let timers_queue = timer_queue(config);
    tokio::time::sleep(Duration::from_millis(MAX_DELAY_MS)).await;
    let deadline = Instant::now() + Duration::from_secs(30) + Duration::from_millis(MAX_DELAY_MS);
    loop {
        let due: i64 = pg
            .query_one(
                "SELECT count(*) AS due FROM stile.timers WHERE queue = $1 AND deliver_at <= clock_timestamp()",
                &[&timers_queue],
            )
            .await?
            .get("due");
        if due == 0 || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Holds every step to its promises.
pub(super) async fn check_steps(database_url: &str, config: &Config, steps: &[Step], report: &mut Report) -> anyhow::Result<()> {
    let pg = connect(database_url).await?;
    let timers_queue = timer_queue(config);
    let count_of = |rows: Vec<tokio_postgres::Row>| -> HashMap<String, i64> {
        rows.iter().map(|r| (r.get("key"), r.get("count"))).collect()
    };
    let pushed = count_of(
        pg.query(
            "SELECT transaction_id AS key, count(*) AS count FROM stile.messages WHERE queue = $1 GROUP BY transaction_id",
            &[&tx_queue(config)],
        )
        .await?,
    );
    let delivered = count_of(
        pg.query(
            "SELECT transaction_id AS key, count(*) AS count FROM stile.messages WHERE queue = $1 GROUP BY transaction_id",
            &[&timers_queue],
        )
        .await?,
    );
    let pending = count_of(
        pg.query("SELECT timer_key AS key, 1::bigint AS count FROM stile.timers WHERE queue = $1", &[&timers_queue]).await?,
    );
    let keys = count_of(pg.query("SELECT key, 1::bigint AS count FROM stile.kv WHERE ns = 'checker'", &[]).await?);

    let mut totals = StepsReport::default();
    let mut violate = |step: &Step, detail: String| {
        report.violations.push(Violation { kind: "steps", partition: String::new(), txn: step.id.clone(), detail });
    };
    for step in steps {
        totals.retries += u64::from(step.attempts.saturating_sub(1));
        match step.kind {
            StepKind::Transaction => {
                totals.transactions += 1;
                match step.answer.as_str() {
                    "committed" => totals.committed += 1,
                    "duplicate" => totals.answered_duplicate += 1,
                    "kv_precondition" => totals.answered_precondition += 1,
                    _ => totals.unanswered += 1,
                }
                let stored = pushed.get(&step.id).copied().unwrap_or(0);
                let key = keys.contains_key(&step.id);
                let rider =
                    step.rider.as_ref().map(|r| delivered.get(r).copied().unwrap_or(0) + pending.get(r).copied().unwrap_or(0));
                if stored > 1 {
                    violate(step, format!("its push was stored {stored} times"));
                }
                if (stored == 1) != key || rider.is_some_and(|r| (r > 0) != key) {
                    violate(
                        step,
                        format!("not all or nothing: push stored {stored}, key {key}, timer rider {rider:?} ({})", step.answer),
                    );
                }
                let answered = matches!(step.answer.as_str(), "committed" | "duplicate" | "kv_precondition");
                if answered && stored != 1 {
                    violate(step, format!("answered {} but its push is not stored", step.answer));
                }
                if let (Some(rider), true) = (&step.rider, answered) {
                    let times = delivered.get(rider).copied().unwrap_or(0);
                    totals.timers += 1;
                    totals.timers_delivered += times as u64;
                    if times != 1 || pending.contains_key(rider) {
                        violate(
                            step,
                            format!("its timer rider was delivered {times} times (pending: {})", pending.contains_key(rider)),
                        );
                    }
                }
            }
            StepKind::Timer => {
                totals.timers += 1;
                let times = delivered.get(&step.id).copied().unwrap_or(0);
                totals.timers_delivered += times as u64;
                if step.answer != "scheduled" {
                    totals.unanswered += 1;
                }
                if times > 1 {
                    violate(step, format!("the timer was delivered {times} times"));
                } else if step.answer == "scheduled" && (times != 1 || pending.contains_key(&step.id)) {
                    violate(step, format!("acknowledged, delivered {times} times (pending: {})", pending.contains_key(&step.id)));
                }
            }
        }
    }
    report.steps = Some(totals);
    Ok(())
}
