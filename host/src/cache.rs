//! A shard's cache, whichever engine runs it.
//!
//! The gateway talks to one [`ShardCache`] per shard: the cache's contract
//! ([`DedupCache`]) and what a host does around it ([`HostedCache`]). With
//! `--engine wasm` (the default) it is the embedded component in wasmtime;
//! with `--engine native` it is the same core compiled into the gateway. The
//! shard worker cannot tell them apart, and neither can change a verdict: a
//! failing wasm instance is retired and rebuilt, and answers "cannot vouch"
//! until it is hydrated again.

use std::ops::{Deref, DerefMut};

use stile_guest::{DedupCache, Shard, ShardConfig};

use crate::wasm::{WasmEngine, WasmShard};

/// Which engine runs the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// The WebAssembly component in wasmtime.
    Wasm,
    /// The same core, compiled natively into the gateway.
    Native,
}

/// A cache as a host keeps it: the contract, and the host's part.
pub trait HostedCache: DedupCache + Send + std::fmt::Debug {
    /// Replaces the cache with an empty one, made with the same
    /// configuration: after PostgreSQL's clock stepped back, the `now` this
    /// cache was given will not come again for a while, and the cache
    /// requires `now` monotone.
    fn reset(&mut self);

    /// The configuration it was made with. Its skew slack is the one the
    /// host's clock floors and hydration reads must use: the cache expires
    /// by it.
    fn config(&self) -> ShardConfig;

    /// How many times an instance was retired and rebuilt (0 natively).
    fn rebuilds(&self) -> u64 {
        0
    }
}

impl HostedCache for Shard {
    fn reset(&mut self) {
        *self = Shard::new(Shard::config(self));
    }

    fn config(&self) -> ShardConfig {
        Shard::config(self)
    }
}

impl HostedCache for WasmShard {
    fn reset(&mut self) {
        WasmShard::reset(self);
    }

    fn config(&self) -> ShardConfig {
        WasmShard::config(self)
    }

    fn rebuilds(&self) -> u64 {
        WasmShard::rebuilds(self)
    }
}

/// One shard's cache.
#[derive(Debug)]
pub struct ShardCache(Box<dyn HostedCache>);

impl ShardCache {
    /// A fresh, empty cache for one shard.
    pub fn new(kind: EngineKind, engine: Option<&WasmEngine>, config: ShardConfig) -> anyhow::Result<ShardCache> {
        Ok(ShardCache(match kind {
            EngineKind::Native => Box::new(Shard::new(config)),
            EngineKind::Wasm => {
                let engine = engine.ok_or_else(|| anyhow::anyhow!("the wasm engine needs a compiled component"))?;
                Box::new(WasmShard::new(engine, config)?)
            }
        }))
    }
}

impl Deref for ShardCache {
    type Target = dyn HostedCache;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl DerefMut for ShardCache {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut *self.0
    }
}
