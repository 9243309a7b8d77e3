//! The fault schedule and the faults themselves: kills and restarts,
//! PostgreSQL restarts, the failover, window changes, clock jumps, the
//! overload's flood; the faults between the gateways and PostgreSQL are
//! `db_faults`'.

use std::net::SocketAddr;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use hyper::Method;
use serde_json::json;

use super::db_faults::{self, DbFault, Edge, SpellTimes};
use super::overload::Flood;
use super::{
    AddressBook, Config, DbRig, FailoverReport, FailoverTimes, InForce, Node, Outcome, PgCluster, ReplicatedPair, Request,
    Status, WindowChange, Windows, micros_of, now_us,
};
use crate::gateway::Client;

#[derive(Clone, Debug)]
pub(super) enum FaultEvent {
    Kill(usize),
    PgRestart,
    /// The replicated pair's primary stopped immediately, its standby
    /// promoted.
    Failover,
    Window(i32),
    /// A gateway's wall clock jumps to this offset (seconds).
    Clock(usize, i64),
    /// A fault between the gateways and PostgreSQL, or in it, begins or ends.
    Db(DbFault, Edge),
    /// The overload's flood begins or ends.
    Overload(Edge),
}

pub(super) fn schedule(config: &Config) -> Vec<(Duration, FaultEvent)> {
    let mut events = Vec::new();
    let run = config.duration;
    if let Some(every) = config.faults.kill_every {
        let mut at = every;
        let mut k = 0;
        while at + config.faults.kill_downtime < run {
            events.push((at, FaultEvent::Kill(k % config.gateways.len())));
            k += 1;
            at += every;
        }
    }
    if let Some(every) = config.faults.pg_restart_every {
        let mut at = every;
        while at < run {
            events.push((at, FaultEvent::PgRestart));
            at += every;
        }
    }
    for &at in &config.faults.pg_restart_at {
        events.push((at, FaultEvent::PgRestart));
    }
    if let Some(at) = config.faults.failover_at {
        events.push((at, FaultEvent::Failover));
    }
    if let Some(short) = config.faults.short_window {
        events.push((run.mul_f64(short.from), FaultEvent::Window(short.seconds)));
        events.push((run.mul_f64(short.to), FaultEvent::Window(config.long_window_seconds)));
    }
    for (gateway, spec) in config.gateways.iter().enumerate() {
        for (at, offset_s) in spec.clock.iter().flat_map(|skew| skew.jumps(run)) {
            events.push((at, FaultEvent::Clock(gateway, offset_s)));
        }
    }
    for (at, fault, edge) in config.faults.db_fault_edges() {
        events.push((at, FaultEvent::Db(fault, edge)));
    }
    if let Some(overload) = &config.faults.overload {
        events.push((overload.spell.at, FaultEvent::Overload(Edge::Begin)));
        events.push((overload.spell.at + overload.spell.lasting, FaultEvent::Overload(Edge::End)));
    }
    events.sort_by_key(|(at, _)| *at);
    events
}

#[derive(Debug, Default)]
pub(super) struct FaultLog {
    pub(super) kills: u64,
    pub(super) restarts: u64,
    pub(super) pg_restarts: u64,
    pub(super) clock_jumps: u64,
    pub(super) failover: Option<FailoverTimes>,
    /// The faults between the gateways and PostgreSQL, as they happened.
    pub(super) spells: Vec<SpellTimes>,
    /// The overload's flood, from its start (stopped at its end, awaited
    /// once the producers are done).
    pub(super) flood: Option<Flood>,
    pub(super) errors: Vec<String>,
    pub(super) unexpected_exits: Vec<String>,
}

/// Configures through whichever gateway answers.
pub(super) struct Admin {
    pub(super) book: AddressBook,
}

impl Admin {
    /// Sets the queue's window; the answer's time is when it surely holds.
    pub(super) async fn configure(&mut self, queue: &str, seconds: i32) -> anyhow::Result<(i64, i64)> {
        let sent_us = now_us();
        let body = json!({ "queue": queue, "options": { "dedupWindowSeconds": seconds } }).to_string();
        let mut last_error = String::new();
        for _ in 0..120 {
            let targets: Vec<SocketAddr> = self.book.read().expect("not poisoned").iter().flatten().map(|(a, _)| *a).collect();
            for addr in targets {
                let attempt = async {
                    let mut client = Client::connect(addr).await?;
                    client.send(Method::POST, "/api/v1/configure", body.clone(), &[("content-type", "application/json")]).await
                };
                match tokio::time::timeout(Duration::from_secs(10), attempt).await {
                    Ok(Ok(reply)) if reply.status == 200 => {
                        let stored = reply.json()["options"]["dedupWindowSeconds"].as_i64();
                        if stored != Some(i64::from(seconds)) {
                            bail!("configure stored {stored:?}, not {seconds}: {}", reply.text());
                        }
                        return Ok((sent_us, now_us()));
                    }
                    Ok(Ok(reply)) => last_error = format!("HTTP {}: {}", reply.status, reply.text()),
                    Ok(Err(error)) => last_error = format!("{error:#}"),
                    Err(_) => last_error = "timed out".to_owned(),
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bail!("configure {queue} to {seconds} s failed: {last_error}")
    }
}

/// The PostgreSQL servers the faults act on.
pub(super) struct PgTargets<'a> {
    /// The cluster a PostgreSQL restart restarts.
    pub(super) cluster: Option<PgCluster>,
    /// The primary and standby a failover switches between.
    pub(super) pair: Option<Arc<ReplicatedPair>>,
    /// The proxy and the server of the run's own.
    pub(super) db: &'a DbRig,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run_faults(
    schedule: &[(Duration, FaultEvent)],
    nodes: &mut [Node],
    book: &AddressBook,
    admin: &mut Admin,
    windows: &Arc<Mutex<Windows>>,
    pg: &PgTargets<'_>,
    config: &Config,
    t0: Instant,
    end: Instant,
    log: &mut FaultLog,
) {
    let mut next = 0;
    let mut in_force = InForce::default();
    loop {
        // A gateway that exited by itself is a finding: report and restart it.
        for (index, node) in nodes.iter_mut().enumerate() {
            if let Some(status) = node.exited() {
                log.unexpected_exits.push(format!("{} exited ({status}):\n{}", node.spec.label, node.tail()));
                restart(index, node, book, log).await;
            }
        }
        if next < schedule.len() && t0.elapsed() >= schedule[next].0 {
            match schedule[next].1 {
                FaultEvent::Kill(index) => {
                    let node = &mut nodes[index];
                    book.write().expect("not poisoned")[index] = None;
                    node.kill();
                    log.kills += 1;
                    tokio::time::sleep(config.faults.kill_downtime).await;
                    restart(index, node, book, log).await;
                }
                FaultEvent::PgRestart => {
                    if let Some(cluster) = &pg.cluster {
                        let cluster = cluster.clone();
                        match tokio::task::spawn_blocking(move || cluster.restart()).await {
                            Ok(Ok(())) => log.pg_restarts += 1,
                            Ok(Err(error)) => log.errors.push(format!("{error:#}")),
                            Err(error) => log.errors.push(format!("pg restart task: {error}")),
                        }
                    }
                }
                FaultEvent::Failover => match &pg.pair {
                    Some(pair) => match pair.fail_over().await {
                        Ok(times) => log.failover = Some(times),
                        Err(error) => log.errors.push(format!("failover: {error:#}")),
                    },
                    None => log.errors.push("a failover without a replicated pair".to_owned()),
                },
                FaultEvent::Window(seconds) => {
                    let sent_us = now_us();
                    let outcome = admin.configure(&config.queue, seconds).await;
                    let (sent_us, acked_us) = match outcome {
                        Ok(times) => times,
                        Err(error) => {
                            log.errors.push(format!("{error:#}"));
                            (sent_us, i64::MAX)
                        }
                    };
                    windows.lock().expect("not poisoned").changes.push(WindowChange { seconds, sent_us, acked_us });
                }
                FaultEvent::Db(fault, edge) => {
                    let pids: Vec<u32> = nodes.iter().filter_map(|node| node.child.as_ref().map(Child::id)).collect();
                    db_faults::apply((fault, edge), pg.db, &mut in_force, config, &pids, log).await;
                }
                FaultEvent::Overload(Edge::Begin) => match &config.faults.overload {
                    Some(overload) => match Flood::start(overload, config, book) {
                        Ok(flood) => log.flood = Some(flood),
                        Err(error) => log.errors.push(format!("start the flood: {error:#}")),
                    },
                    None => log.errors.push("an overload spell without an overload configured".to_owned()),
                },
                FaultEvent::Overload(Edge::End) => {
                    if let Some(flood) = &mut log.flood {
                        flood.stop();
                    }
                }
                FaultEvent::Clock(index, offset_s) => {
                    let node = &nodes[index];
                    match node.clock.as_ref().map(|file| file.set(offset_s)) {
                        Some(Ok(())) => log.clock_jumps += 1,
                        Some(Err(error)) => log.errors.push(format!("{}: {error:#}", node.spec.label)),
                        None => log.errors.push(format!("{}: a clock jump without a clock file", node.spec.label)),
                    }
                }
            }
            next += 1;
            continue;
        }
        if Instant::now() >= end && next >= schedule.len() {
            break;
        }
        if Instant::now() >= end + config.request_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A spell that outlasted the run ends with it.
    db_faults::release_all(pg.db, &mut in_force, log).await;
    if let Some(flood) = &mut log.flood {
        flood.stop();
    }
}

pub(super) async fn restart(index: usize, node: &mut Node, book: &AddressBook, log: &mut FaultLog) {
    node.kill();
    node.incarnation += 1;
    for attempt in 0..30 {
        match node.start().await {
            Ok(addr) => {
                book.write().expect("not poisoned")[index] = Some((addr, node.incarnation));
                log.restarts += 1;
                return;
            }
            Err(error) => {
                if attempt == 29 {
                    log.errors.push(format!("restart {}: {error:#}", node.spec.label));
                }
                // The address may still be taken, or the database down:
                // after a few tries, any free port will do.
                if attempt >= 3 {
                    node.addr = None;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// How the workload fared around a failover: what was acknowledged before
/// the stop, how soon and how often pushes failed after it, and what was
/// served after it.
pub(super) fn failover_report(times: &FailoverTimes, requests: &[Request], t0: Instant) -> FailoverReport {
    let since_t0 = |us: i64| Duration::from_micros(u64::try_from(us - micros_of(t0)).unwrap_or(0));
    let mut report = FailoverReport {
        sync_state: times.sync_state.clone(),
        primary_exit: times.primary_exit.clone(),
        stopped_at: since_t0(times.stopped_us),
        promoted_at: since_t0(times.promoted_us),
        ..FailoverReport::default()
    };
    let mut served_again_us: Option<i64> = None;
    for attempt in requests.iter().flat_map(|r| &r.attempts) {
        let after = attempt.sent_us >= times.stopped_us;
        match &attempt.outcome {
            Outcome::Answered(answers) => {
                let queued = answers.iter().filter(|a| a.status == Status::Queued).count() as u64;
                if attempt.done_us < times.stopped_us {
                    report.queued_before += queued;
                } else if after {
                    report.answered_after += answers.len() as u64;
                    report.queued_after += queued;
                    served_again_us = Some(served_again_us.map_or(attempt.done_us, |us| us.min(attempt.done_us)));
                }
            }
            Outcome::Status(503, _) if after => report.failed_after_503s += 1,
            _ if after => report.failed_after_other += 1,
            _ => {}
        }
    }
    report.served_again_after =
        served_again_us.map(|us| Duration::from_micros(u64::try_from(us - times.stopped_us).unwrap_or(0)));
    report
}
