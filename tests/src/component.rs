//! The embedded component behind the core's `Cache` trait, for tests that
//! drive it as they drive the native core.

use std::sync::OnceLock;

use stile::component::COMPONENT;
use stile::wasm::{WasmEngine, WasmShard};
use stile_guest::{
    Admission, Commit, DedupCache, HydrateError, Hydration, Millis, PartitionId, Plan, Segment, ShardConfig, Stats,
};

/// One compiled component per test binary.
pub fn engine() -> &'static WasmEngine {
    static ENGINE: OnceLock<WasmEngine> = OnceLock::new();
    ENGINE.get_or_init(|| WasmEngine::new(COMPONENT).expect("compile the embedded component"))
}

/// The gateway's wrapper of one instance, checked after every call. The
/// wrapper answers like an empty cache after a trap, which is sound but would
/// hide a guest bug from a test; so every call asserts the instance never
/// trapped and was never rebuilt.
#[derive(Debug)]
pub struct HealthyShard(WasmShard);

impl HealthyShard {
    pub fn new(config: ShardConfig) -> HealthyShard {
        HealthyShard(WasmShard::new(engine(), config).expect("instantiate the component"))
    }

    fn healthy<R>(&self, value: R) -> R {
        assert_eq!(self.0.rebuilds(), 0, "the component trapped and was rebuilt");
        value
    }
}

impl DedupCache for HealthyShard {
    fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
        let plans = self.0.plan(now_ms, segments);
        self.healthy(plans)
    }

    fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]) {
        self.0.record_commits(now_ms, commits);
        self.healthy(());
    }

    fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        let admission = self.0.admit(now_ms, partition, window_ms, estimate_hashes);
        self.healthy(admission)
    }

    fn hydrate(&mut self, now_ms: Millis, hydration: &Hydration<'_>) -> Result<(), HydrateError> {
        let result = self.0.hydrate(now_ms, hydration);
        self.healthy(result)
    }

    fn expire(&mut self, now_ms: Millis) {
        self.0.expire(now_ms);
        self.healthy(());
    }

    fn forget(&mut self, partition: PartitionId) {
        self.0.forget(partition);
        self.healthy(());
    }

    fn stats(&mut self) -> Stats {
        let stats = self.0.stats();
        self.healthy(stats)
    }
}
