//! Several gateway processes: two in front of one database, and the two cache
//! engines side by side. The cache may only make stile faster, so neither a
//! second gateway nor the engine may change an answer.

use std::collections::{BTreeMap, HashMap};

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom as _, SliceRandom as _};
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};
use stile_tests::gateway::{Answer, Client, Gateway, GatewayOptions, fresh_database, item};
use stile_tests::pg::TestDb;

/// Every stored message of a queue: `(partition, offset) → (message id, transactionId)`.
async fn stored(t: &TestDb, queue: &str) -> BTreeMap<(String, i64), (String, String)> {
    let c = t.client().await;
    let rows = c
        .query(
            "SELECT p.name AS partition, s.base_offset + m.i - 1 AS offset, m.id::text AS message_id, m.txn \
               FROM stile.segments s JOIN stile.partitions p ON p.id = s.partition_id \
              CROSS JOIN LATERAL unnest(s.message_ids, s.transaction_ids) WITH ORDINALITY AS m(id, txn, i) \
              WHERE p.queue = $1",
            &[&queue],
        )
        .await
        .expect("read the stored messages");
    rows.iter().map(|r| ((r.get("partition"), r.get("offset")), (r.get("message_id"), r.get("txn")))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_database_store_every_id_exactly_once() {
    const IDS: usize = 400;
    const PARTITIONS: usize = 4;
    const PUSHES_PER_GATEWAY: usize = 3;
    const TASKS_PER_GATEWAY: usize = 4;
    let t = fresh_database().await;
    let gateways = [Gateway::start(&t.url()).await, Gateway::start(&t.url()).await];

    let partition_of = |id: usize| format!("p{}", id % PARTITIONS);
    let mut rng = StdRng::seed_from_u64(0x5eed_0001);
    // Every id, several times through each gateway, in a shuffled order, cut
    // into one stream per task.
    let mut streams: Vec<Vec<usize>> = vec![Vec::new(); 2 * TASKS_PER_GATEWAY];
    for (g, _) in gateways.iter().enumerate() {
        let mut pushes: Vec<usize> = (0..IDS).flat_map(|id| std::iter::repeat_n(id, PUSHES_PER_GATEWAY)).collect();
        pushes.shuffle(&mut rng);
        for (k, id) in pushes.into_iter().enumerate() {
            streams[g * TASKS_PER_GATEWAY + k % TASKS_PER_GATEWAY].push(id);
        }
    }
    let mut tasks = Vec::new();
    for (s, stream) in streams.into_iter().enumerate() {
        let mut client = gateways[s / TASKS_PER_GATEWAY].client().await;
        let mut rng = StdRng::seed_from_u64(s as u64);
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            let mut rest = stream.as_slice();
            while !rest.is_empty() {
                // Batches of 1..=16 items, mixing partitions.
                let (batch, tail) = rest.split_at(rng.random_range(1..=16).min(rest.len()));
                rest = tail;
                let items = batch
                    .iter()
                    .map(|&id| item("multi", &partition_of(id), Some(&format!("id-{id}")), json!({ "task": s })))
                    .collect();
                answers.extend(client.push(items).await);
            }
            answers
        }));
    }
    let mut answers: Vec<Answer> = Vec::new();
    for task in tasks {
        answers.extend(task.await.expect("a pushing task"));
    }
    assert_eq!(answers.len(), IDS * 2 * PUSHES_PER_GATEWAY);

    let stored = stored(&t, "multi").await;
    assert_eq!(stored.len(), IDS, "every id stored exactly once");
    let mut by_id: HashMap<&str, (&str, i64)> = HashMap::new();
    for ((partition, offset), (message_id, txn)) in &stored {
        let id: usize = txn.strip_prefix("id-").and_then(|n| n.parse().ok()).expect("a pushed id");
        assert_eq!(partition, &partition_of(id));
        assert!(by_id.insert(txn.as_str(), (message_id.as_str(), *offset)).is_none(), "{txn} stored twice");
    }
    let c = t.client().await;
    let rows = c.query("SELECT name, last_offset FROM stile.partitions WHERE queue = 'multi'", &[]).await.unwrap();
    for row in rows {
        let (name, last): (String, i64) = (row.get("name"), row.get("last_offset"));
        let count = stored.keys().filter(|(p, _)| *p == name).count() as i64;
        assert_eq!(last + 1, count, "{name}: offsets are dense");
    }

    let mut queued: HashMap<&str, usize> = HashMap::new();
    for answer in &answers {
        let (message_id, offset) = by_id[answer.transaction_id.as_str()];
        assert_eq!((answer.message_id.as_str(), answer.offset), (message_id, offset), "{answer:?} names the stored message");
        let (stored_id, stored_txn) = &stored[&(answer.partition.clone(), answer.offset)];
        assert_eq!((stored_id, stored_txn), (&answer.message_id, &answer.transaction_id), "the answer's offset holds its id");
        if answer.queued() {
            *queued.entry(answer.transaction_id.as_str()).or_default() += 1;
        }
    }
    assert_eq!(queued.len(), IDS, "every id was answered queued once");
    assert!(queued.values().all(|&n| n == 1), "and only once");
}

/// One scripted request.
#[derive(Clone, Debug)]
enum Step {
    Push(Vec<Value>),
    Configure(&'static str, Value),
}

/// A seeded sequence: new ids, retries, repeats inside a request, pushes
/// without an id, the same id in another partition, and a window switched
/// off and on again.
fn script(seed: u64, requests: usize) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let partitions = ["a", "b", "c"];
    let mut pushed: Vec<String> = Vec::new();
    let mut steps = vec![Step::Configure("eng0", json!({"dedupWindowSeconds": 0}))];
    for request in 0..requests {
        if request == requests / 2 {
            steps.push(Step::Configure("eng0", json!({"dedupWindowSeconds": 3600})));
            steps.push(Step::Configure("eng", json!({"dedupWindowSeconds": 0})));
        }
        if request == 3 * requests / 4 {
            steps.push(Step::Configure("eng", json!({"dedupWindowSeconds": 3600})));
        }
        let queue = if rng.random_bool(0.2) { "eng0" } else { "eng" };
        let partition = *partitions.choose(&mut rng).expect("partitions");
        let mut items: Vec<Value> = Vec::new();
        for _ in 0..rng.random_range(1..=12) {
            let roll = rng.random_range(0..100);
            let id = if roll < 40 || pushed.is_empty() {
                let id = format!("n{}", pushed.len());
                pushed.push(id.clone());
                Some(id)
            } else if roll < 75 {
                // A retry of an id pushed before, maybe to another partition.
                Some(pushed.choose(&mut rng).expect("ids").clone())
            } else if roll < 90 && !items.is_empty() {
                // A repeat inside this request.
                items.choose(&mut rng).expect("items")["transactionId"].as_str().map(str::to_owned)
            } else {
                None
            };
            items.push(item(queue, partition, id.as_deref(), json!({ "r": request })));
        }
        steps.push(Step::Push(items));
    }
    steps
}

/// What must match between engines: per item, `(queue, partition, status,
/// offset, transactionId if given)`; message ids differ by construction.
type Projected = Vec<(String, String, String, i64, Option<String>)>;

async fn run_script(client: &mut Client, steps: &[Step]) -> Vec<Projected> {
    let mut out = Vec::new();
    // Within one run, a duplicate names the message id answered for its offset.
    let mut ids_by_offset: HashMap<(String, String, i64), String> = HashMap::new();
    for step in steps {
        match step {
            Step::Configure(queue, options) => {
                client.configure(queue, options.clone()).await;
            }
            Step::Push(items) => {
                let answers = client.push(items.clone()).await;
                let mut projected = Vec::new();
                for (answer, item) in answers.iter().zip(items) {
                    let given = item.get("transactionId").and_then(Value::as_str).map(str::to_owned);
                    if let Some(id) = &given {
                        assert_eq!(&answer.transaction_id, id);
                    }
                    let key = (answer.queue.clone(), answer.partition.clone(), answer.offset);
                    let known = ids_by_offset.entry(key).or_insert_with(|| answer.message_id.clone());
                    assert_eq!(known, &answer.message_id, "{answer:?}: one message id per offset");
                    projected.push((answer.queue.clone(), answer.partition.clone(), answer.status.clone(), answer.offset, given));
                }
                out.push(projected);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_and_wasm_engines_give_the_same_answers() {
    let steps = script(0x5eed_0002, 240);
    let (wasm_db, native_db) = (fresh_database().await, fresh_database().await);
    let wasm = Gateway::start_with(&wasm_db.url(), &GatewayOptions { engine: Some("wasm"), ..Default::default() }).await;
    let native = Gateway::start_with(&native_db.url(), &GatewayOptions { engine: Some("native"), ..Default::default() }).await;
    assert!(wasm.logs().contains("engine Wasm"), "{}", wasm.logs());
    assert!(native.logs().contains("engine Native"), "{}", native.logs());
    let (mut wasm_client, mut native_client) = (wasm.client().await, native.client().await);
    let (from_wasm, from_native) = tokio::join!(run_script(&mut wasm_client, &steps), run_script(&mut native_client, &steps));

    assert_eq!(from_wasm.len(), from_native.len());
    for (request, (w, n)) in from_wasm.iter().zip(&from_native).enumerate() {
        assert_eq!(w, n, "request {request}: the engines disagree");
    }
    // The script exercised what it claims to.
    let all: Vec<&(String, String, String, i64, Option<String>)> = from_wasm.iter().flatten().collect();
    let count = |status: &str, queue: &str| all.iter().filter(|a| a.2 == status && a.0 == queue).count();
    assert!(count("duplicate", "eng") > 100, "duplicates: {}", count("duplicate", "eng"));
    assert!(count("queued", "eng") > 100);
    assert!(count("queued", "eng0") > 20);
    // And the two databases hold the same logs (but for the message ids).
    let (a, b) = (stored(&wasm_db, "eng").await, stored(&native_db, "eng").await);
    // Scripted ids start with "n"; a message pushed without one holds its
    // own (different) message id.
    let strip = |m: &BTreeMap<(String, i64), (String, String)>| {
        m.iter()
            .map(|(k, (_, txn))| (k.clone(), if txn.starts_with('n') { txn.clone() } else { "(message id)".to_owned() }))
            .collect::<Vec<_>>()
    };
    let (a, b) = (strip(&a), strip(&b));
    assert_eq!(a.len(), b.len(), "stored message counts differ");
    if let Some((x, y)) = a.iter().zip(&b).find(|(x, y)| x != y) {
        panic!("the stored logs differ: wasm {x:?}, native {y:?}");
    }
}
