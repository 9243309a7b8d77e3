//! The truth, read from SQL after the run.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::anyhow;
use serde_json::Value;
use uuid::Uuid;

/// One stored message.
#[derive(Clone, Debug)]
pub(super) struct Copy {
    pub(super) offset: i64,
    pub(super) message_id: Uuid,
    pub(super) txn: String,
    pub(super) created_us: i64,
    /// `[producer, request, attempt]` from its payload.
    pub(super) writer: Option<(usize, u64, u32)>,
    pub(super) payload: Value,
}

#[derive(Debug, Default)]
pub(super) struct Stored {
    /// partition → its messages in offset order.
    pub(super) partitions: BTreeMap<String, Vec<Copy>>,
    /// partition → its id (which places it on a shard).
    pub(super) ids: BTreeMap<String, i64>,
    /// Storage problems found while reading.
    pub(super) problems: Vec<(String, String)>,
}

pub(super) async fn read_stored(database_url: &str, queue: &str) -> anyhow::Result<Stored> {
    let mut config = stile::db::DbConfig::parse(database_url).map_err(|e| anyhow!("{e}"))?;
    config.pg.connect_timeout(Duration::from_secs(10));
    let mut client = None;
    let mut last_error = String::new();
    for _ in 0..60 {
        match crate::pg::connect(&config).await {
            Ok(c) => {
                client = Some(c);
                break;
            }
            Err(e) => {
                last_error = e.to_string();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    let client = client.ok_or_else(|| anyhow!("connect to read the truth: {last_error}"))?;
    let partitions = client
        .query("SELECT id, name, last_offset, txns_start FROM stile.partitions WHERE queue = $1 ORDER BY id", &[&queue])
        .await?;
    let mut stored = Stored::default();
    for row in partitions {
        let id: i64 = row.get("id");
        let name: String = row.get("name");
        let last_offset: i64 = row.get("last_offset");
        let txns_start: i64 = row.get("txns_start");
        let segments = client
            .query(
                "SELECT base_offset, end_offset, (extract(epoch FROM created_at) * 1000000)::bigint AS created_us, \
                        message_ids, transaction_ids, payloads \
                   FROM stile.segments WHERE partition_id = $1 ORDER BY base_offset",
                &[&id],
            )
            .await?;
        let txns = client
            .query(
                "SELECT base_offset, end_offset, (extract(epoch FROM created_at) * 1000000)::bigint AS created_us, hashes \
                   FROM stile.txns WHERE partition_id = $1 ORDER BY base_offset",
                &[&id],
            )
            .await?;
        let mut problem = |what: String| stored.problems.push((name.clone(), what));
        if txns_start != 0 {
            problem(format!("txns_start is {txns_start} though nothing was purged"));
        }
        let mut txns_by_base: HashMap<i64, (i64, i64, Vec<u8>)> = txns
            .iter()
            .map(|r| (r.get::<_, i64>("base_offset"), (r.get("end_offset"), r.get("created_us"), r.get("hashes"))))
            .collect();
        let mut copies = Vec::new();
        let mut expected_base = 0i64;
        for row in &segments {
            let base: i64 = row.get("base_offset");
            let end: i64 = row.get("end_offset");
            let created_us: i64 = row.get("created_us");
            let message_ids: Vec<Uuid> = row.get("message_ids");
            let transaction_ids: Vec<String> = row.get("transaction_ids");
            let payloads: Vec<Value> = row.get("payloads");
            if base != expected_base {
                problem(format!("segments do not tile the offsets: expected a segment at {expected_base}, found {base}"));
            }
            expected_base = end + 1;
            let count = usize::try_from(end - base + 1).unwrap_or(0);
            if message_ids.len() != count || transaction_ids.len() != count || payloads.len() != count {
                problem(format!(
                    "segment {base}..={end} holds {} ids, {} transactionIds, {} payloads",
                    message_ids.len(),
                    transaction_ids.len(),
                    payloads.len()
                ));
            }
            match txns_by_base.remove(&base) {
                None => problem(format!("segment {base}..={end} has no txns row")),
                Some((t_end, t_created, hashes)) => {
                    let expected: Vec<u8> = transaction_ids.iter().flat_map(|t| stile::hash::txn_hash(t)).collect();
                    if t_end != end || t_created != created_us || hashes != expected {
                        problem(format!(
                            "txns row {base} (end {t_end}, created {t_created}, {} hash bytes) does not match its segment (end {end}, created {created_us}, {} ids)",
                            hashes.len(),
                            transaction_ids.len()
                        ));
                    }
                }
            }
            for (i, ((message_id, txn), payload)) in message_ids.into_iter().zip(transaction_ids).zip(payloads).enumerate() {
                let writer = payload.get("c").and_then(Value::as_array).and_then(|c| match c.as_slice() {
                    [p, r, a] => Some((usize::try_from(p.as_u64()?).ok()?, r.as_u64()?, u32::try_from(a.as_u64()?).ok()?)),
                    _ => None,
                });
                copies.push(Copy { offset: base + i as i64, message_id, txn, created_us, writer, payload });
            }
        }
        if expected_base != last_offset + 1 {
            problem(format!("the allocator is at {last_offset} but the segments end at {}", expected_base - 1));
        }
        for base in txns_by_base.keys() {
            problem(format!("txns row {base} has no segment"));
        }
        stored.ids.insert(name.clone(), id);
        stored.partitions.insert(name, copies);
    }
    Ok(stored)
}
