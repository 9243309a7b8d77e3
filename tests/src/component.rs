//! The embedded component behind the core's `Cache` trait, for tests that
//! drive it as they drive the native core.

use std::sync::OnceLock;

use stile::component::COMPONENT;
use stile::wasm::{WasmEngine, WasmShard};
use stile_guest::testing::{Forwarding, Observed, Observing};
use stile_guest::{DedupCache, ShardConfig};

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
pub struct HealthyShard(Observing<WasmShard, fn(&mut WasmShard, Observed<'_, '_>)>);

impl HealthyShard {
    pub fn new(config: ShardConfig) -> HealthyShard {
        let shard = WasmShard::new(engine(), config).expect("instantiate the component");
        HealthyShard(Observing::new(shard, assert_healthy))
    }
}

fn assert_healthy(shard: &mut WasmShard, _: Observed<'_, '_>) {
    assert_eq!(shard.rebuilds(), 0, "the component trapped and was rebuilt");
}

impl Forwarding for HealthyShard {
    fn inner(&mut self) -> &mut dyn DedupCache {
        &mut self.0
    }
}
