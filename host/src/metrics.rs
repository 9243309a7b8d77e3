//! Prometheus metrics, rendered as text at `GET /metrics`.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use stile_guest::HydrateError;

use crate::db::ProbeMode;
use crate::intake::{IntakeCounters, IntakeState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabel {
    probe: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabel {
    shard: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// Every metric the gateway exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    pushes: Family<StatusLabel, Counter>,
    segments: Family<ProbeLabel, Counter>,
    hydrations: Family<OutcomeLabel, Counter>,
    flush_sizes: Histogram,
    sql_seconds: Histogram,
    guest_seconds: Histogram,
    cache_bytes: Family<ShardLabel, Gauge>,
    cache_entries: Family<ShardLabel, Gauge>,
    cache_hashes: Family<ShardLabel, Gauge>,
    suppressed: Family<ShardLabel, Gauge>,
    rebuilds: Family<ShardLabel, Gauge>,
    evictions: Family<ShardLabel, Gauge>,
    unavailable: Counter,
    resident_memory: Gauge,
    clock_offset: Gauge<f64, AtomicU64>,
    clock_steps_back: Counter,
    vouches_refused: Counter,
    bundles_split: Counter,
    bundle_lock_timeouts: Counter,
    held_request_bytes: Gauge,
    held_request_bytes_limit: Gauge,
    requests_waited_for_room: Counter,
    requests_shed: Counter,
    requests_abandoned: Counter,
    requests_waiting_for_room: Gauge,
    intake_saturated: Gauge,
    transactions: Family<OutcomeLabel, Counter>,
    kv_operations: Family<OutcomeLabel, Counter>,
    timers_fired: Counter,
    timers_set_aside: Counter,
    kv_purged: Counter,
}

impl Metrics {
    pub fn new() -> Metrics {
        let metrics = Metrics {
            registry: Mutex::new(Registry::with_prefix("stile")),
            pushes: Family::default(),
            segments: Family::default(),
            hydrations: Family::default(),
            flush_sizes: Histogram::new(exponential_buckets(1.0, 4.0, 8)),
            sql_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            guest_seconds: Histogram::new(exponential_buckets(0.000_001, 4.0, 10)),
            cache_bytes: Family::default(),
            cache_entries: Family::default(),
            cache_hashes: Family::default(),
            suppressed: Family::default(),
            rebuilds: Family::default(),
            evictions: Family::default(),
            unavailable: Counter::default(),
            resident_memory: Gauge::default(),
            clock_offset: Gauge::default(),
            clock_steps_back: Counter::default(),
            vouches_refused: Counter::default(),
            bundles_split: Counter::default(),
            bundle_lock_timeouts: Counter::default(),
            held_request_bytes: Gauge::default(),
            held_request_bytes_limit: Gauge::default(),
            requests_waited_for_room: Counter::default(),
            requests_shed: Counter::default(),
            requests_abandoned: Counter::default(),
            requests_waiting_for_room: Gauge::default(),
            intake_saturated: Gauge::default(),
            transactions: Family::default(),
            kv_operations: Family::default(),
            timers_fired: Counter::default(),
            timers_set_aside: Counter::default(),
            kv_purged: Counter::default(),
        };
        {
            let mut r = metrics.registry.lock().expect("not poisoned");
            r.register("pushes", "Pushed messages by final status", metrics.pushes.clone());
            r.register(
                "segments",
                "Segments pushed by probe mode (skipped, narrowed, full, committed, off)",
                metrics.segments.clone(),
            );
            r.register(
                "hydrations",
                "Cache hydrations by outcome (installed, refused, lost, suppressed)",
                metrics.hydrations.clone(),
            );
            r.register("flush_size_messages", "Messages per flushed segment", metrics.flush_sizes.clone());
            r.register("sql_push_seconds", "Latency of one bundle's push function call", metrics.sql_seconds.clone());
            r.register("guest_call_seconds", "Latency of one cache call", metrics.guest_seconds.clone());
            r.register("cache_bytes", "Bytes the cache accounts for", metrics.cache_bytes.clone());
            r.register("cache_entries", "Partitions with a resident cache entry", metrics.cache_entries.clone());
            r.register("cache_hashes", "Hashes resident in the cache", metrics.cache_hashes.clone());
            r.register("cache_suppressed_partitions", "Partitions suppressed by the cache budget", metrics.suppressed.clone());
            r.register("cache_instance_rebuilds", "Cache instances retired and rebuilt", metrics.rebuilds.clone());
            r.register("cache_evictions", "Cache entries evicted by the budget", metrics.evictions.clone());
            r.register(
                "database_unavailable",
                "Requests answered 503 because the database was unreachable",
                metrics.unavailable.clone(),
            );
            r.register(
                "clock_offset_seconds",
                "This gateway's wall clock minus PostgreSQL's, as measured from the database's clock readings \
                 (to within a round trip; the cache judges age by PostgreSQL's clock, never by this one)",
                metrics.clock_offset.clone(),
            );
            r.register(
                "database_clock_steps_back",
                "Readings that showed PostgreSQL's clock stepped back; each replaced a shard's cache",
                metrics.clock_steps_back.clone(),
            );
            r.register(
                "vouches_refused",
                "Segments whose cache vouch the push function refused, its clock being behind the time the cache judged age by",
                metrics.vouches_refused.clone(),
            );
            r.register(
                "bundles_split",
                "Bundles PostgreSQL refused for a reason other than being unavailable, then pushed again one segment at a time",
                metrics.bundles_split.clone(),
            );
            r.register(
                "bundle_lock_timeouts",
                "Pushes whose wait for a partition's row lock outlasted --lock-timeout; partitions found locked by another session are then pushed on their own until one gets through",
                metrics.bundle_lock_timeouts.clone(),
            );
            r.register(
                "held_request_bytes",
                "Bytes held by requests in progress, as the intake charges them (body, parsed items, answer)",
                metrics.held_request_bytes.clone(),
            );
            r.register(
                "held_request_bytes_limit",
                "The most bytes requests in progress may hold (--max-held-mb); past it, requests wait unread or are refused",
                metrics.held_request_bytes_limit.clone(),
            );
            r.register(
                "requests_waited_for_room",
                "Requests that found the intake full and waited, their bodies unread, for room",
                metrics.requests_waited_for_room.clone(),
            );
            r.register(
                "requests_shed",
                "Requests answered 503 for want of room, their bodies unread: the backlog would not drain within --queue-timeout, or none came within it",
                metrics.requests_shed.clone(),
            );
            r.register(
                "requests_abandoned",
                "Requests whose client hung up while they waited for room: not read, run or answered",
                metrics.requests_abandoned.clone(),
            );
            r.register(
                "requests_waiting_for_room",
                "Requests waiting now for room, their bodies unread",
                metrics.requests_waiting_for_room.clone(),
            );
            r.register(
                "intake_saturated",
                "1 while requests wait for room or one was refused within the last second, else 0",
                metrics.intake_saturated.clone(),
            );
            r.register(
                "transactions",
                "Transactions by outcome (committed, duplicate, kv_precondition)",
                metrics.transactions.clone(),
            );
            r.register("kv_operations", "KV operations by outcome (applied, refused, read)", metrics.kv_operations.clone());
            r.register(
                "timers_fired",
                "Timers fired: their message pushed and their row deleted in one transaction",
                metrics.timers_fired.clone(),
            );
            r.register(
                "timers_set_aside",
                "Fires of a timer that failed on its own (its payload unreadable, its push refused); each sets the timer aside for a backoff while the others fire",
                metrics.timers_set_aside.clone(),
            );
            r.register("kv_purged", "Expired keys deleted in the background", metrics.kv_purged.clone());
            r.register(
                "process_resident_memory_bytes",
                "Resident memory of the gateway process (Linux; 0 elsewhere)",
                metrics.resident_memory.clone(),
            );
        }
        metrics
    }

    /// A transaction's outcome: `committed`, `duplicate` or `kv_precondition`.
    pub fn transaction(&self, outcome: &'static str) {
        self.transactions.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// KV operations answered: `applied`, `refused` (a write whose
    /// precondition did not hold) or `read`.
    pub fn kv_operations(&self, outcome: &'static str, count: u64) {
        self.kv_operations.get_or_create(&OutcomeLabel { outcome }).inc_by(count);
    }

    pub fn timers_fired(&self, count: u64) {
        self.timers_fired.inc_by(count);
    }

    pub fn timer_set_aside(&self) {
        self.timers_set_aside.inc();
    }

    pub fn kv_purged(&self, count: u64) {
        self.kv_purged.inc_by(count);
    }

    pub fn pushed(&self, queued: u64, duplicate: u64) {
        self.pushes.get_or_create(&StatusLabel { status: "queued" }).inc_by(queued);
        self.pushes.get_or_create(&StatusLabel { status: "duplicate" }).inc_by(duplicate);
    }

    pub fn segment(&self, probe: ProbeMode) {
        self.segments.get_or_create(&ProbeLabel { probe: probe.as_str() }).inc();
    }

    /// A hydration's outcome: `installed`, `refused` (malformed or window
    /// 0), or `lost` (the instance failed during the call).
    pub fn hydration(&self, result: Result<(), HydrateError>) {
        let outcome = match result {
            Ok(()) => "installed",
            Err(HydrateError::Lost) => "lost",
            Err(HydrateError::Malformed | HydrateError::WindowOff) => "refused",
        };
        self.hydrations.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// A hydration whose rows the budget refused once their size was known:
    /// `suppressed`, never copied into the cache.
    pub fn hydration_suppressed(&self) {
        self.hydrations.get_or_create(&OutcomeLabel { outcome: "suppressed" }).inc();
    }

    pub fn flush_size(&self, messages: usize) {
        self.flush_sizes.observe(messages as f64);
    }

    pub fn sql_call(&self, elapsed: Duration) {
        self.sql_seconds.observe(elapsed.as_secs_f64());
    }

    pub fn guest_call(&self, elapsed: Duration) {
        self.guest_seconds.observe(elapsed.as_secs_f64());
    }

    pub fn unavailable(&self) {
        self.unavailable.inc();
    }

    /// The latest measured offset of this gateway's wall clock from
    /// PostgreSQL's, in milliseconds (positive: the gateway is ahead).
    pub fn clock_offset(&self, offset_ms: i64) {
        self.clock_offset.set(offset_ms as f64 / 1000.0);
    }

    pub fn database_clock_stepped_back(&self) {
        self.clock_steps_back.inc();
    }

    pub fn vouch_refused(&self) {
        self.vouches_refused.inc();
    }

    pub fn bundle_split(&self) {
        self.bundles_split.inc();
    }

    pub fn bundle_lock_timeout(&self) {
        self.bundle_lock_timeouts.inc();
    }

    /// The counters the intake counts its waiting and refused requests in.
    pub fn intake_counters(&self) -> IntakeCounters {
        IntakeCounters {
            waited: self.requests_waited_for_room.clone(),
            shed: self.requests_shed.clone(),
            abandoned: self.requests_abandoned.clone(),
        }
    }

    /// Publishes what requests in progress hold, the limit, and whether the
    /// intake is saturated.
    pub fn publish_intake(&self, state: &IntakeState) {
        let gauge = |bytes: usize| i64::try_from(bytes).unwrap_or(i64::MAX);
        self.held_request_bytes.set(gauge(state.held_bytes));
        self.held_request_bytes_limit.set(gauge(state.limit_bytes));
        self.requests_waiting_for_room.set(gauge(state.waiting_requests));
        self.intake_saturated.set(i64::from(state.saturated));
    }

    /// Publishes one shard's cache gauges.
    pub fn publish_shard(&self, shard: usize, stats: &stile_guest::Stats, rebuilds: u64) {
        let label = ShardLabel { shard: u32::try_from(shard).unwrap_or(u32::MAX) };
        let set = |family: &Family<ShardLabel, Gauge>, value: u64| {
            family.get_or_create(&label).set(i64::try_from(value).unwrap_or(i64::MAX));
        };
        set(&self.cache_bytes, stats.bytes);
        set(&self.cache_entries, stats.entries);
        set(&self.cache_hashes, stats.hashes);
        set(&self.suppressed, stats.suppressed);
        set(&self.rebuilds, rebuilds);
        set(&self.evictions, stats.evictions);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.resident_memory.set(resident_memory_bytes().map_or(0, |bytes| i64::try_from(bytes).unwrap_or(i64::MAX)));
        let mut text = String::new();
        let registry = self.registry.lock().expect("not poisoned");
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("writing to a String cannot fail");
        text
    }
}

/// The process's resident set, from the `VmRSS` line of `/proc/self/status`.
/// Read at each scrape, so that the figure an operator sees is the kernel's,
/// not the cache's own accounting.
fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}
