//! The cache component in wasmtime: one compiled component and one
//! `InstancePre` shared by every shard, one `Store` and instance per shard.
//!
//! Every call runs under an epoch deadline and the store under a memory
//! limit. A trap, an exhausted deadline or a failed memory grow retires the
//! instance: the shard is rebuilt from the shared `InstancePre`, and the call
//! that failed answers as an empty cache would (`-1`, cold). A shard whose
//! instance cannot be rebuilt keeps serving without one, answering as an
//! empty cache, and tries again on later calls with a backoff (100 ms,
//! doubling to 30 s). The verdicts never depend on the guest.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use stile_guest as core;
use wasmtime::component::{Component, Linker, ResourceAny};
use wasmtime::{Config, Engine, Store, StoreLimits, StoreLimitsBuilder};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "dedup",
});

pub mod convert;

/// The WIT's types, as `bindgen!` generates them for a host.
pub use exports::stile::dedup::cache as wit;

/// How often the epoch advances.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Ticks one call may run before it is interrupted: two seconds, far beyond
/// any honest call (a plan is microseconds, a million-hash hydration well under
/// a second) and short enough that a runaway guest cannot stall a shard.
const CALL_DEADLINE_TICKS: u64 = 200;

/// The compiled component, shared by every shard.
#[derive(Clone)]
pub struct WasmEngine {
    engine: Engine,
    pre: DedupPre<StoreState>,
    faults: Arc<FaultInjection>,
    _ticker: Arc<EpochTicker>,
}

impl std::fmt::Debug for WasmEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmEngine").finish_non_exhaustive()
    }
}

/// Test-only switches: trap a fraction of guest calls, by cutting their
/// epoch deadline to nothing, so that the rebuild path runs for real; and
/// make instantiation fail, so that the path without an instance does.
#[derive(Debug, Default)]
pub struct FaultInjection {
    /// Calls per million that trap.
    pub trap_per_million: AtomicU32,
    /// While set, every new instance fails to start.
    pub refuse_instances: AtomicBool,
}

/// The first wait before instantiating again after a failure; it doubles up
/// to [`REBUILD_BACKOFF_MAX`].
const REBUILD_BACKOFF_MIN: Duration = Duration::from_millis(100);
const REBUILD_BACKOFF_MAX: Duration = Duration::from_secs(30);

impl WasmEngine {
    /// Compiles `component` (the embedded one by default) and prepares it for
    /// instantiation. The component imports nothing, so the linker is empty.
    pub fn new(component: &[u8]) -> anyhow::Result<WasmEngine> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        // Compiled on this thread: the component is small (about 40 ms
        // more at start), and a pool of compiler threads would sit idle for
        // the process's life holding what compiling allocated (about 50 MB
        // resident, with mimalloc's per-thread heaps).
        config.parallel_compilation(false);
        let engine = Engine::new(&config)?;
        let component = Component::new(&engine, component).map_err(anyhow::Error::from).context("compile the cache component")?;
        let linker = Linker::<StoreState>::new(&engine);
        let pre = DedupPre::new(linker.instantiate_pre(&component)?)?;
        let ticker = Arc::new(EpochTicker::start(engine.clone()));
        Ok(WasmEngine { engine, pre, faults: Arc::new(FaultInjection::default()), _ticker: ticker })
    }

    /// The switch that injects guest traps (for fault tests).
    pub fn faults(&self) -> &Arc<FaultInjection> {
        &self.faults
    }
}

/// What each store carries: its memory limits.
struct StoreState {
    limits: StoreLimits,
}

/// One shard's cache inside one wasmtime instance.
pub struct WasmShard {
    engine: WasmEngine,
    config: core::ShardConfig,
    /// `None` while no instance could be made: calls answer as an empty
    /// cache until one can.
    live: Option<Live>,
    /// When to try instantiating again while `live` is `None`.
    next_attempt: Instant,
    backoff: Duration,
    rebuilds: u64,
    fault_counter: u64,
}

impl std::fmt::Debug for WasmShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmShard").field("config", &self.config).field("rebuilds", &self.rebuilds).finish_non_exhaustive()
    }
}

/// A live instance and its shard resource.
struct Live {
    store: Store<StoreState>,
    bindings: Dedup,
    shard: ResourceAny,
}

impl WasmShard {
    pub fn new(engine: &WasmEngine, config: core::ShardConfig) -> anyhow::Result<WasmShard> {
        let live = Live::instantiate(engine, config)?;
        Ok(WasmShard {
            engine: engine.clone(),
            config,
            live: Some(live),
            next_attempt: Instant::now(),
            backoff: REBUILD_BACKOFF_MIN,
            rebuilds: 0,
            fault_counter: 0,
        })
    }

    /// Whether an instance is running (none while instantiation fails).
    pub fn is_live(&self) -> bool {
        self.live.is_some()
    }

    pub fn config(&self) -> core::ShardConfig {
        self.config
    }

    pub fn rebuilds(&self) -> u64 {
        self.rebuilds
    }

    /// Runs one guest call under the deadline. On failure the instance is
    /// retired and rebuilt, and the call answers `None`; without an
    /// instance, it answers `None` at once.
    fn call<R>(
        &mut self,
        f: impl FnOnce(wit::GuestShard<'_>, &mut Store<StoreState>, ResourceAny) -> wasmtime::Result<R>,
    ) -> Option<R> {
        if self.live.is_none() && Instant::now() >= self.next_attempt {
            self.replace_instance();
        }
        let deadline = if self.inject_fault() { 0 } else { CALL_DEADLINE_TICKS };
        let Live { store, bindings, shard } = self.live.as_mut()?;
        store.set_epoch_deadline(deadline);
        match f(bindings.stile_dedup_cache().shard(), store, *shard) {
            Ok(value) => Some(value),
            Err(error) => {
                tracing::warn!(error = %error, "cache instance failed; rebuilding it");
                self.retire();
                None
            }
        }
    }

    fn inject_fault(&mut self) -> bool {
        let per_million = self.engine.faults.trap_per_million.load(Ordering::Relaxed);
        if per_million == 0 {
            return false;
        }
        // A deterministic spread: every call advances a counter, and a fixed
        // fraction of them (scrambled so the traps do not align with flush
        // boundaries) fail.
        self.fault_counter = self.fault_counter.wrapping_add(1);
        let scrambled = self.fault_counter.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        scrambled % 1_000_000 < u64::from(per_million)
    }

    /// Drops the instance, with everything it holds, for a fresh one.
    pub fn reset(&mut self) {
        self.replace_instance();
    }

    fn retire(&mut self) {
        self.rebuilds += 1;
        self.replace_instance();
    }

    /// Drops the instance and makes a new one. If that fails, the shard goes
    /// on without one (every call answers as an empty cache) and tries again
    /// after the backoff.
    fn replace_instance(&mut self) {
        self.live = None;
        match Live::instantiate(&self.engine, self.config) {
            Ok(live) => {
                self.live = Some(live);
                self.backoff = REBUILD_BACKOFF_MIN;
            }
            Err(error) => {
                tracing::error!(
                    error = %error,
                    retry_in_ms = self.backoff.as_millis() as u64,
                    "cannot make a cache instance; the shard probes in full until one starts"
                );
                self.next_attempt = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(REBUILD_BACKOFF_MAX);
            }
        }
    }
}

/// The contract, through the component: each call converts the core's
/// types to the WIT's and back, and a failed call answers as an empty cache.
impl core::DedupCache for WasmShard {
    fn plan(&mut self, now_ms: core::Millis, segments: &[core::Segment<'_>]) -> Vec<core::Plan> {
        let count = segments.len();
        let segments = convert::segments(segments);
        match self.call(|guest, store, shard| guest.call_plan(store, shard, now_ms, &segments)) {
            Some(plans) => plans.into_iter().map(convert::plan).collect(),
            None => (0..count)
                .map(|_| core::Plan { p_verified: core::NO_VOUCH, local_hits: Vec::new(), state: core::EntryState::Cold })
                .collect(),
        }
    }

    fn record_commits(&mut self, now_ms: core::Millis, commits: &[core::Commit<'_>]) {
        let commits = convert::commits(commits);
        self.call(|guest, store, shard| guest.call_record_commits(store, shard, now_ms, &commits));
    }

    fn admit(
        &mut self,
        now_ms: core::Millis,
        partition: core::PartitionId,
        window_ms: u64,
        estimate_hashes: u64,
    ) -> core::Admission {
        self.call(|guest, store, shard| guest.call_admit(store, shard, now_ms, partition, window_ms, estimate_hashes))
            .map_or(core::Admission::Suppressed, convert::admission)
    }

    fn hydrate(&mut self, now_ms: core::Millis, hydration: &core::Hydration<'_>) -> Result<(), core::HydrateError> {
        let hydration = convert::hydration(hydration);
        match self.call(|guest, store, shard| guest.call_hydrate(store, shard, now_ms, &hydration)) {
            Some(result) => result.map_err(convert::hydrate_error),
            // The instance failed and was replaced by an empty one: the rows
            // were well formed, and simply not kept.
            None => Err(core::HydrateError::Lost),
        }
    }

    fn expire(&mut self, now_ms: core::Millis) {
        self.call(|guest, store, shard| guest.call_expire(store, shard, now_ms));
    }

    fn forget(&mut self, partition: core::PartitionId) {
        self.call(|guest, store, shard| guest.call_forget(store, shard, partition));
    }

    fn stats(&mut self) -> core::Stats {
        self.call(|guest, store, shard| guest.call_stats(store, shard)).map(convert::stats).unwrap_or_default()
    }
}

impl Live {
    fn instantiate(engine: &WasmEngine, config: core::ShardConfig) -> anyhow::Result<Live> {
        if engine.faults.refuse_instances.load(Ordering::Relaxed) {
            anyhow::bail!("instantiation refused (fault injection)");
        }
        let limits = StoreLimitsBuilder::new().memory_size(memory_limit(config.budget_bytes)).trap_on_grow_failure(true).build();
        let mut store = Store::new(&engine.engine, StoreState { limits });
        store.limiter(|state| &mut state.limits);
        store.set_epoch_deadline(CALL_DEADLINE_TICKS);
        let bindings = engine.pre.instantiate(&mut store)?;
        let shard = bindings.stile_dedup_cache().shard().call_constructor(&mut store, convert::config(config))?;
        Ok(Live { store, bindings, shard })
    }
}

/// The linear-memory ceiling of one instance. The budget is soft (a partition
/// used in the last five seconds is never evicted), so the ceiling leaves room
/// above it; it exists to turn a runaway guest into a trap, not to enforce the
/// budget.
fn memory_limit(budget_bytes: u64) -> usize {
    let limit = budget_bytes.saturating_mul(2).saturating_add(256 << 20);
    usize::try_from(limit.min(u64::from(u32::MAX))).unwrap_or(usize::MAX)
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("stile-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .expect("spawn the epoch ticker");
        EpochTicker { stop, thread: Some(thread) }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
