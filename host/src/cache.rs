//! A shard's cache, whichever engine runs it.
//!
//! The gateway talks to one [`ShardCache`] per shard. With `--engine wasm`
//! (the default) it is the embedded component in wasmtime; with
//! `--engine native` it is the same core compiled into the gateway. Both
//! answer in `stile_guest`'s vocabulary, so the shard worker cannot tell them
//! apart, and neither can change a verdict: a failing wasm instance is retired
//! and rebuilt, and answers "cannot vouch" until it is hydrated again.

use stile_guest::{Admission, Commit, HydrateError, Hydration, Millis, PartitionId, Plan, Segment, Shard, ShardConfig, Stats};

use crate::wasm::{Installed, WasmEngine, WasmShard};

/// Which engine runs the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// The WebAssembly component in wasmtime.
    Wasm,
    /// The same core, compiled natively into the gateway.
    Native,
}

/// One shard's cache.
#[derive(Debug)]
pub enum ShardCache {
    Native(Box<Shard>),
    Wasm(Box<WasmShard>),
}

impl ShardCache {
    /// A fresh, empty cache for one shard.
    pub fn new(kind: EngineKind, engine: Option<&WasmEngine>, config: ShardConfig) -> anyhow::Result<ShardCache> {
        Ok(match kind {
            EngineKind::Native => ShardCache::Native(Box::new(Shard::new(config))),
            EngineKind::Wasm => {
                let engine = engine.ok_or_else(|| anyhow::anyhow!("the wasm engine needs a compiled component"))?;
                ShardCache::Wasm(Box::new(WasmShard::new(engine, config)?))
            }
        })
    }

    pub fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
        match self {
            ShardCache::Native(shard) => shard.plan(now_ms, segments),
            ShardCache::Wasm(shard) => shard.plan(now_ms, segments),
        }
    }

    pub fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]) {
        match self {
            ShardCache::Native(shard) => shard.record_commits(now_ms, commits),
            ShardCache::Wasm(shard) => shard.record_commits(now_ms, commits),
        }
    }

    pub fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        match self {
            ShardCache::Native(shard) => shard.admit(now_ms, partition, window_ms, estimate_hashes),
            ShardCache::Wasm(shard) => shard.admit(now_ms, partition, window_ms, estimate_hashes),
        }
    }

    pub fn hydrate(&mut self, now_ms: Millis, hydration: &Hydration<'_>) -> Result<Installed, HydrateError> {
        match self {
            ShardCache::Native(shard) => shard.hydrate(now_ms, hydration).map(|()| Installed::Yes),
            ShardCache::Wasm(shard) => shard.hydrate(now_ms, hydration),
        }
    }

    pub fn expire(&mut self, now_ms: Millis) {
        match self {
            ShardCache::Native(shard) => shard.expire(now_ms),
            ShardCache::Wasm(shard) => shard.expire(now_ms),
        }
    }

    pub fn forget(&mut self, partition: PartitionId) {
        match self {
            ShardCache::Native(shard) => shard.forget(partition),
            ShardCache::Wasm(shard) => shard.forget(partition),
        }
    }

    pub fn stats(&mut self) -> Stats {
        match self {
            ShardCache::Native(shard) => shard.stats(),
            ShardCache::Wasm(shard) => shard.stats(),
        }
    }

    /// Replaces the cache with an empty one, made with the same
    /// configuration: after PostgreSQL's clock stepped back, the `now` this
    /// cache was given will not come again for a while, and the cache
    /// requires `now` monotone.
    pub fn reset(&mut self) {
        match self {
            ShardCache::Native(shard) => **shard = Shard::new(shard.config()),
            ShardCache::Wasm(shard) => shard.reset(),
        }
    }

    /// How many times the wasm instance was retired and rebuilt.
    pub fn rebuilds(&self) -> u64 {
        match self {
            ShardCache::Native(_) => 0,
            ShardCache::Wasm(shard) => shard.rebuilds(),
        }
    }
}
