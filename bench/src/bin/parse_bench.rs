//! Reading a push body: MB/s of the gateway's push-body reader (one pass) and
//! of the stepwise serde_json reading it replaced, on the bodies `load` sends
//! (its `write_push_body`: 1 and 100 items, payloads of about 60 bytes),
//! beside serde_json's own syntax check of the same bytes
//! (`from_slice::<IgnoredAny>`, which builds and validates nothing else) and
//! the UTF-8 check the reader starts with; and the allocations the request
//! path makes without the network: parsing, layer 1's plan
//! (`RequestPlan::new`), the shard's queue (`PartitionQueue`: the messages
//! added, one segment taken), the answers and their body.
//!
//! Allocations are counted by a counting global allocator over mimalloc (the
//! gateway's allocator); every candidate runs under it, so its cost is the
//! same for all. Figures are medians over `--rounds` rounds, the candidates
//! interleaved in each round.
//!
//! ```sh
//! cargo run --release -p stile-bench --bin parse_bench -- --rounds 9
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use stile::fusion::{Message, PartitionQueue};
use stile::gateway::RequestPlan;
use stile::hash::txn_hash;
use stile::shard::Outcome;
use stile_bench::{machine, median, write_push_body};
use uuid::Uuid;

/// Counts every allocation (and reallocation) made through it.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static REALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to mimalloc, which upholds
// `GlobalAlloc`'s contract; the counters are only observed.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout is passed on as given.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by mimalloc through this allocator.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        REALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; the new size is the caller's.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Parser, Debug)]
#[command(about = "push-body parsing: MB/s and allocations per item")]
struct Args {
    /// Rounds; each candidate's figure is the median.
    #[arg(long, default_value_t = 9)]
    rounds: usize,
    /// Time each candidate runs per round and batch size, in milliseconds.
    #[arg(long, default_value_t = 300)]
    millis: u64,
    /// The batch sizes (items per request).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 100])]
    sizes: Vec<usize>,
    /// Only the readers whose name holds this text (for a profile of one).
    #[arg(long)]
    only: Option<String>,
}

/// A way to read a body: it answers how many items it found (checked against
/// the others, and kept from the optimiser).
struct Candidate {
    name: &'static str,
    read: fn(&Bytes) -> usize,
}

const MAX_ITEMS: usize = 10_000;

fn candidates() -> Vec<Candidate> {
    vec![
        Candidate {
            name: "stile::push::parse_push (one pass)",
            read: |body| stile::push::parse_push(body, MAX_ITEMS).expect("valid").len(),
        },
        Candidate {
            name: "stile::push::stepwise::parse_push",
            read: |body| stile::push::stepwise::parse_push(body, MAX_ITEMS).expect("valid").len(),
        },
        Candidate {
            name: "serde_json IgnoredAny",
            read: |body| {
                serde_json::from_slice::<serde::de::IgnoredAny>(body).expect("valid");
                0
            },
        },
        Candidate {
            name: "std::str::from_utf8",
            read: |body| {
                std::str::from_utf8(body).expect("valid");
                0
            },
        },
    ]
}

/// `count` distinct bodies of `size` items, as one `load` connection writes
/// them.
fn bodies(size: usize, count: usize) -> Vec<Bytes> {
    let mut body = String::new();
    (0..count)
        .map(|seq| {
            write_push_body(&mut body, "load-warm", seq % 64, &format!("r0-s{size}-c7"), seq as u64, size);
            Bytes::from(body.clone())
        })
        .collect()
}

/// MB/s of `read` over `bodies`, cycled for about `time`.
fn throughput(read: fn(&Bytes) -> usize, bodies: &[Bytes], time: Duration) -> f64 {
    let started = Instant::now();
    let mut bytes = 0usize;
    let mut found = 0usize;
    while started.elapsed() < time {
        for body in bodies {
            found += read(black_box(body));
            bytes += body.len();
        }
    }
    black_box(found);
    bytes as f64 / started.elapsed().as_secs_f64() / 1e6
}

fn allocations_during<T>(work: impl FnOnce() -> T) -> (u64, T) {
    let before = ALLOCATIONS.load(Ordering::Relaxed) + REALLOCATIONS.load(Ordering::Relaxed);
    let out = work();
    (ALLOCATIONS.load(Ordering::Relaxed) + REALLOCATIONS.load(Ordering::Relaxed) - before, out)
}

/// Allocations of the request path without the network, for one body, by
/// step: parsing, layer 1's plan, the shard's queue (the leaders' messages
/// added to their partition's queue and taken as one segment), the answers
/// (each item answered as queued) and the answer's body.
struct PathAllocations {
    parse: u64,
    plan: u64,
    queue: u64,
    answers: u64,
    body: u64,
}

impl PathAllocations {
    fn all(&self) -> u64 {
        self.parse + self.plan + self.queue + self.answers + self.body
    }
}

fn request_path_allocations(body: &Bytes) -> PathAllocations {
    let (parse, items) = allocations_during(|| stile::push::parse_push(body, MAX_ITEMS).expect("valid"));
    let count = items.len();
    // The messages a shard receives, made outside the count (the plan made
    // them once already, and keeps them to itself).
    let messages: Vec<Message> = items
        .iter()
        .map(|item| {
            let transaction_id = item.transaction_id.clone().expect("load's bodies name every transactionId");
            Message { message_id: Uuid::now_v7(), hash: txn_hash(&transaction_id), transaction_id, payload: item.payload.clone() }
        })
        .collect();
    let (plan, plan_made) = allocations_during(|| RequestPlan::new(items));
    let (queue, segment) = allocations_during(|| {
        let mut queue = PartitionQueue::default();
        queue.add(0, messages.into_iter().enumerate().map(|(i, m)| (u32::try_from(i).expect("bounded"), m)));
        queue.take_segment(count)
    });
    drop(segment);
    let outcomes: Vec<Option<Outcome>> =
        (0..count).map(|offset| Some(Outcome::Queued { message_id: Uuid::now_v7(), offset: offset as i64 })).collect();
    let (answers, results) = allocations_during(|| plan_made.answer(&outcomes));
    let (body, rendered) = allocations_during(|| stile::push::answer::render(&results));
    drop((results, rendered));
    PathAllocations { parse, plan, queue, answers, body }
}

fn main() {
    let args = Args::parse();
    let candidates: Vec<Candidate> =
        candidates().into_iter().filter(|c| args.only.as_ref().is_none_or(|only| c.name.contains(only.as_str()))).collect();
    println!("# parse_bench: {} rounds of {} ms per candidate and size; {}", args.rounds, args.millis, machine());
    for &size in &args.sizes {
        let bodies = bodies(size, 256);
        let mean_len = bodies.iter().map(Bytes::len).sum::<usize>() / bodies.len();
        for candidate in &candidates {
            let counts: Vec<usize> = bodies.iter().map(|b| (candidate.read)(b)).collect();
            assert!(counts.iter().all(|&n| n == size || n == 0), "{} read {counts:?}", candidate.name);
        }
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); candidates.len()];
        for _ in 0..args.rounds {
            for (candidate, rates) in candidates.iter().zip(&mut rates) {
                rates.push(throughput(candidate.read, &bodies, Duration::from_millis(args.millis)));
            }
        }
        println!();
        println!("## batch {size} (bodies of {mean_len} bytes)");
        println!();
        println!("| reader | MB/s (median) | ns per item | min-max MB/s |");
        println!("|---|---:|---:|---|");
        for (candidate, rates) in candidates.iter().zip(&rates) {
            let mb_s = median(rates.iter().copied());
            let (lo, hi) = rates.iter().fold((f64::MAX, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
            let ns_per_item = mean_len as f64 / mb_s / size as f64 * 1e3;
            println!("| {} | {mb_s:.0} | {ns_per_item:.0} | {lo:.0}-{hi:.0} |", candidate.name);
        }
        let path = request_path_allocations(&bodies[0]);
        let (stepwise, _) = allocations_during(|| stile::push::stepwise::parse_push(&bodies[0], MAX_ITEMS).expect("valid"));
        let per = |n: u64| n as f64 / size as f64;
        println!();
        println!("allocations per item of the stepwise reading: {:.2}", per(stepwise));
        println!(
            "allocations per item: parse {:.2}, layer-1 plan {:.2}, shard queue {:.2}, answers {:.2}, answer body {:.2}; all {:.2} ({} per request)",
            per(path.parse),
            per(path.plan),
            per(path.queue),
            per(path.answers),
            per(path.body),
            per(path.all()),
            path.all()
        );
    }
}
