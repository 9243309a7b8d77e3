//! The cross-host trace, `tests/trace/cache-trace.json`: the checked-in file
//! must be exactly what the native core records today, and the component
//! must answer every call in it as the native core did, through a plain
//! wasmtime embedding and through the gateway's own wrapper.
//!
//! The Node and Python hosts replay the same file (`embed/run-tests.sh`).

use std::path::PathBuf;
use std::sync::OnceLock;

use stile::component::COMPONENT;
use stile::wasm::{Dedup, convert};
use stile_guest::{Admission, Commit, DedupCache, HydrateError, Hydration, Millis, PartitionId, Plan, Segment, Shard, Stats};
use stile_tests::component::HealthyShard;
use stile_tests::trace::{self, Trace};
use wasmtime::component::{Component, Linker, ResourceAny};
use wasmtime::{Engine, Store};

/// The checked-in trace, read once.
fn checked_in() -> &'static (String, Trace) {
    static TRACE: OnceLock<(String, Trace)> = OnceLock::new();
    TRACE.get_or_init(|| {
        let path = trace::path();
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}; run `{}`", path.display(), trace::REGENERATE));
        let parsed = trace::from_json(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        (text, parsed)
    })
}

#[test]
fn the_checked_in_trace_is_what_the_native_core_records() {
    let fresh = trace::to_json(&trace::record());
    if let Some(difference) = trace::staleness(&checked_in().0, &fresh) {
        panic!(
            "{} is stale: the native core (or the scenario) changed since it was written.\n{difference}\n\
             Regenerate it with `{}` and commit it.",
            trace::path().display(),
            trace::REGENERATE
        );
    }
}

#[test]
fn the_file_reads_back_as_the_recorded_trace() {
    assert_eq!(checked_in().1, trace::record());
}

#[test]
fn the_trace_covers_every_call_and_answer() {
    use trace::Call;
    let calls = &checked_in().1.calls;
    let names: std::collections::BTreeSet<&str> = calls.iter().map(|step| step.call.name()).collect();
    assert_eq!(names.len(), 7, "every method of the shard resource: {names:?}");
    let states: std::collections::BTreeSet<String> = calls
        .iter()
        .filter_map(|step| match &step.call {
            Call::Plan { expect, .. } => Some(expect.iter().map(|plan| format!("{:?}", plan.state)).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(states.len(), 5, "every entry-state: {states:?}");
    let admissions = calls.iter().filter_map(|step| match step.call {
        Call::Admit { expect, .. } => Some(expect),
        _ => None,
    });
    assert!(admissions.clone().any(|a| a == Admission::Hydrate) && admissions.clone().any(|a| a == Admission::Suppressed));
    let errors: Vec<_> = calls
        .iter()
        .filter_map(|step| match step.call {
            Call::Hydrate { expect: Err(error), .. } => Some(error),
            _ => None,
        })
        .collect();
    assert!(errors.contains(&HydrateError::Malformed) && errors.contains(&HydrateError::WindowOff));
    let last = calls.iter().rev().find_map(|step| match step.call {
        Call::Stats { expect } => Some(expect),
        _ => None,
    });
    let last = last.expect("the trace reads stats");
    assert!(last.evictions > 0 && last.expired_generations > 0 && last.local_hits > 0 && last.hydrations > 0);
}

#[test]
fn the_native_core_replays_the_trace() {
    let trace = &checked_in().1;
    let mut shard = Shard::new(trace.config);
    trace::replay(trace, &mut shard).unwrap_or_else(|divergence| panic!("{divergence}"));
}

/// The component in a plain wasmtime embedding, as any Rust host would load
/// it: no epoch deadline, no memory limit, no rebuild on a trap (the types
/// and conversions are the gateway's, `stile::wasm::{Dedup, wit, convert}`;
/// `tests/examples/embed.rs` runs `bindgen!` itself). A trap fails the test.
struct Plain {
    store: Store<()>,
    bindings: Dedup,
    shard: ResourceAny,
}

impl Plain {
    fn new(component: &[u8], config: stile_guest::ShardConfig) -> Plain {
        let engine = Engine::default();
        let component = Component::new(&engine, component).expect("compile the component");
        let linker = Linker::new(&engine);
        let mut store = Store::new(&engine, ());
        let bindings = Dedup::instantiate(&mut store, &component, &linker).expect("instantiate: the component imports nothing");
        let shard = bindings
            .stile_dedup_cache()
            .shard()
            .call_constructor(&mut store, convert::config(config))
            .expect("construct a shard");
        Plain { store, bindings, shard }
    }
}

impl DedupCache for Plain {
    fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
        let segments = convert::segments(segments);
        let plans =
            self.bindings.stile_dedup_cache().shard().call_plan(&mut self.store, self.shard, now_ms, &segments).expect("plan");
        plans.into_iter().map(convert::plan).collect()
    }

    fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]) {
        let commits = convert::commits(commits);
        self.bindings
            .stile_dedup_cache()
            .shard()
            .call_record_commits(&mut self.store, self.shard, now_ms, &commits)
            .expect("record-commits");
    }

    fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        let admission = self
            .bindings
            .stile_dedup_cache()
            .shard()
            .call_admit(&mut self.store, self.shard, now_ms, partition, window_ms, estimate_hashes)
            .expect("admit");
        convert::admission(admission)
    }

    fn hydrate(&mut self, now_ms: Millis, hydration: &Hydration<'_>) -> Result<(), HydrateError> {
        let hydration = convert::hydration(hydration);
        let result = self
            .bindings
            .stile_dedup_cache()
            .shard()
            .call_hydrate(&mut self.store, self.shard, now_ms, &hydration)
            .expect("hydrate");
        result.map_err(convert::hydrate_error)
    }

    fn expire(&mut self, now_ms: Millis) {
        self.bindings.stile_dedup_cache().shard().call_expire(&mut self.store, self.shard, now_ms).expect("expire");
    }

    fn forget(&mut self, partition: PartitionId) {
        self.bindings.stile_dedup_cache().shard().call_forget(&mut self.store, self.shard, partition).expect("forget");
    }

    fn stats(&mut self) -> Stats {
        convert::stats(self.bindings.stile_dedup_cache().shard().call_stats(&mut self.store, self.shard).expect("stats"))
    }
}

#[test]
fn the_component_replays_the_trace_in_plain_wasmtime() {
    let trace = &checked_in().1;
    let mut component = Plain::new(COMPONENT, trace.config);
    let calls = trace::replay(trace, &mut component).unwrap_or_else(|divergence| panic!("the component diverged: {divergence}"));
    assert_eq!(calls, trace.calls.len());
}

#[test]
fn the_gateway_wrapper_replays_the_trace() {
    let trace = &checked_in().1;
    let mut shard = HealthyShard::new(trace.config);
    trace::replay(trace, &mut shard).unwrap_or_else(|divergence| panic!("the gateway's wrapper diverged: {divergence}"));
}

/// `target/stile_dedup.wasm` is what the Node and Python hosts load; the
/// build writes it next to embedding it, and it must be the same component.
#[test]
fn the_published_component_file_is_the_embedded_one() {
    let published = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("target").join("stile_dedup.wasm");
    let bytes = std::fs::read(&published).unwrap_or_else(|error| panic!("cannot read {}: {error}", published.display()));
    assert!(
        bytes == COMPONENT,
        "{} differs from stile::component::COMPONENT; rebuild with `cargo build --release -p stile`",
        published.display()
    );
    let trace = &checked_in().1;
    let mut component = Plain::new(&bytes, trace.config);
    trace::replay(trace, &mut component).unwrap_or_else(|divergence| panic!("the published component diverged: {divergence}"));
}

/// The replay compares answers for real: a trace with one answer changed
/// fails on exactly that call.
#[test]
fn a_changed_answer_is_caught_at_its_call() {
    use trace::Call;
    let mut trace = checked_in().1.clone();
    let index = trace.calls.iter().rposition(|step| matches!(step.call, Call::Plan { .. })).expect("the trace plans");
    if let Call::Plan { expect, .. } = &mut trace.calls[index].call {
        expect[0].p_verified += 1;
    }
    let divergence = trace::replay(&trace, &mut Shard::new(trace.config)).expect_err("the changed answer is caught");
    assert_eq!((divergence.index, divergence.call), (index, "plan"));
}
