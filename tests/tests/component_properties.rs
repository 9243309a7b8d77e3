//! The cache's properties, run against the real component in wasmtime: the
//! same model-based driver and event-window checks that `stile-guest` runs
//! against its native core, and a differential run that feeds one scenario
//! to both and compares every answer.

use std::cell::RefCell;
use std::rc::Rc;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use stile_guest::testing::{self, Forwarding, Observed, Observing, Scenario, floors, window};
use stile_guest::{Admission, DedupCache, HydrateError, Millis, PartitionId, Plan, Shard, ShardConfig, Stats};
use stile_tests::component::HealthyShard;

/// `cases` cases, with failures saved beside this file.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// The driver's property: the component never vouches over a hash
    /// PostgreSQL holds, and is not trivially sound either.
    #[test]
    fn the_component_never_vouches_over_a_stored_duplicate(scenario in testing::scenario()) {
        testing::run(&scenario, HealthyShard::new).map_err(|violation| TestCaseError::fail(violation.to_string()))?;
    }
}

#[test]
fn window_semantics() {
    window::window_semantics(&mut HealthyShard::new(window::CONFIG));
}

#[test]
fn retries_floor_within_an_arrival_step() {
    let furthest = floors::retries_floor_within_an_arrival_step(&mut HealthyShard::new(window::CONFIG), 400);
    println!("the furthest floor was {furthest} offsets below its retry's original");
}

#[test]
fn memory_bounded_by_rate_times_window() {
    let mut component = HealthyShard::new(window::CONFIG);
    let report = window::memory_bounded_by_rate_times_window(&mut component);
    println!("{report:?}; {:?}", DedupCache::stats(&mut component));
}

/// One call and its answer, as the recording wrapper saw it. Calls without
/// an answer are logged too, so that the two logs stay aligned.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Plan { now_ms: Millis, plans: Vec<Plan> },
    RecordCommits { now_ms: Millis, commits: usize },
    Admit { partition: PartitionId, admission: Admission },
    Hydrate { partition: PartitionId, result: Result<(), HydrateError> },
    Expire { now_ms: Millis },
    Forget { partition: PartitionId },
    Stats(Stats),
}

/// Passes every call through to `inner` and logs it with its answer.
fn recording<C: DedupCache>(inner: C, log: Rc<RefCell<Vec<Call>>>) -> impl DedupCache {
    Observing::new(inner, move |_: &mut C, call: Observed<'_, '_>| log.borrow_mut().push(Call::of(call)))
}

impl Call {
    fn of(call: Observed<'_, '_>) -> Call {
        match call {
            Observed::Plan { now_ms, plans, .. } => Call::Plan { now_ms, plans: plans.to_vec() },
            Observed::RecordCommits { now_ms, commits } => Call::RecordCommits { now_ms, commits: commits.len() },
            Observed::Admit { partition, admission, .. } => Call::Admit { partition, admission },
            Observed::Hydrate { hydration, result, .. } => Call::Hydrate { partition: hydration.partition, result },
            Observed::Expire { now_ms } => Call::Expire { now_ms },
            Observed::Forget { partition } => Call::Forget { partition },
            Observed::Stats { stats } => Call::Stats(stats),
        }
    }
}

/// Runs `scenario` through `make`'s cache and answers the driver's verdict
/// and the log of every call.
fn record<C: DedupCache>(
    scenario: &Scenario,
    mut make: impl FnMut(ShardConfig) -> C,
) -> (Result<(), testing::Violation>, Vec<Call>) {
    let log = Rc::new(RefCell::new(Vec::new()));
    let verdict = testing::run(scenario, |config| recording(make(config), Rc::clone(&log)));
    let calls = log.take();
    (verdict, calls)
}

fn differential(scenario: &Scenario) -> Result<(), TestCaseError> {
    let (native_verdict, native) = record(scenario, Shard::new);
    let (component_verdict, component) = record(scenario, HealthyShard::new);
    if let Some(index) = native.iter().zip(&component).position(|(a, b)| a != b) {
        let context = index.saturating_sub(3)..index;
        return Err(TestCaseError::fail(format!(
            "call {index} differs\n  native:    {:?}\n  component: {:?}\n  after: {:#?}",
            native[index], component[index], &native[context]
        )));
    }
    prop_assert_eq!(native.len(), component.len(), "one log is a prefix of the other");
    prop_assert_eq!(native_verdict, component_verdict);
    Ok(())
}

proptest! {
    #![proptest_config(config(128))]

    /// The component is the native core: the same calls get the same plans,
    /// admissions, hydration results and stats, call by call.
    #[test]
    fn the_component_answers_exactly_as_the_native_core(scenario in testing::scenario()) {
        differential(&scenario)?;
    }
}

/// Runs `check` against a fresh native shard and a fresh component, each
/// recorded, and compares the two logs.
fn compare_on(check: impl Fn(&mut dyn DedupCache)) {
    let log_native = Rc::new(RefCell::new(Vec::new()));
    let log_component = Rc::new(RefCell::new(Vec::new()));
    check(&mut recording(Shard::new(window::CONFIG), Rc::clone(&log_native)));
    check(&mut recording(HealthyShard::new(window::CONFIG), Rc::clone(&log_component)));
    let (native, component) = (log_native.take(), log_component.take());
    if let Some(index) = native.iter().zip(&component).position(|(a, b)| a != b) {
        panic!("call {index} differs\n  native:    {:?}\n  component: {:?}", native[index], component[index]);
    }
    assert_eq!(native.len(), component.len());
}

/// The differential run on the event-window workloads too: large segments,
/// sealed blocks, expiring generations.
#[test]
fn the_component_matches_the_native_core_on_the_window_workloads() {
    compare_on(|cache| window::window_semantics(&mut Dyn(cache)));
    compare_on(|cache| {
        window::memory_bounded_by_rate_times_window(&mut Dyn(cache));
    });
}

/// A sized handle on a `dyn DedupCache`, for the generic checks.
struct Dyn<'a>(&'a mut dyn DedupCache);

impl Forwarding for Dyn<'_> {
    fn inner(&mut self) -> &mut dyn DedupCache {
        &mut *self.0
    }
}
