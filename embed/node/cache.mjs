// Helpers for hosting stile's dedup cache component in Node, over the
// bindings jco generates (`npm run transpile` writes them to generated/).
//
// jco maps the WIT as follows: s64/u64 are BigInt, list<u8> is Uint8Array,
// list<u32> is Uint32Array, records are objects with camelCase keys, enums are
// strings ('vouching', 'hydrate', 'window-off', ...), the `shard` resource is
// the class `cache.Shard`, and an `err` of `hydrate` is thrown as a
// ComponentError whose `payload` is the error's name.

/** Concatenates 32-digit hex hashes into the flat list<u8> the WIT takes. */
export function hashBytes(hexes) {
  return Uint8Array.from(Buffer.from(hexes.join(''), 'hex'));
}

/** 'segments-planned' -> 'segmentsPlanned' */
export function camel(kebab) {
  return kebab.replace(/-([a-z])/g, (_, c) => c.toUpperCase());
}

/** 'segmentsPlanned' -> 'segments-planned' */
export function kebab(camelCase) {
  return camelCase.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
}

/** A shard-config from the trace's config. */
export function shardConfig(config) {
  return { budgetBytes: BigInt(config['budget-bytes']), skewSlackMs: config['skew-slack-ms'] };
}

/** The trace's form of a plan: numbers and plain arrays, kebab-case keys. */
export function planJson(plan) {
  return { 'p-verified': Number(plan.pVerified), 'local-hits': Array.from(plan.localHits), state: plan.state };
}

/** The trace's form of stats. */
export function statsJson(stats) {
  return Object.fromEntries(Object.entries(stats).map(([key, value]) => [kebab(key), Number(value)]));
}

/** Calls `hydrate` and answers the trace's form of its result. */
export function hydrateJson(shard, nowMs, hydration) {
  try {
    shard.hydrate(nowMs, hydration);
    return { ok: null };
  } catch (error) {
    if (typeof error?.payload === 'string') return { err: error.payload };
    throw error;
  }
}

/**
 * Performs one call of the trace on `shard` and answers what the call
 * answered, in the trace's JSON form (undefined for calls without an answer).
 */
export function perform(shard, call) {
  const now = call['now-ms'] === undefined ? undefined : BigInt(call['now-ms']);
  switch (call.call) {
    case 'plan': {
      const segments = call.segments.map((s) => ({
        partition: BigInt(s.partition),
        windowMs: BigInt(s['window-ms']),
        hashes: hashBytes(s.hashes),
      }));
      return shard.plan(now, segments).map(planJson);
    }
    case 'record-commits': {
      const commits = call.commits.map((c) => ({
        partition: BigInt(c.partition),
        baseOffset: BigInt(c['base-offset']),
        createdMs: BigInt(c['created-ms']),
        hashes: hashBytes(c.hashes),
      }));
      shard.recordCommits(now, commits);
      return undefined;
    }
    case 'admit':
      return shard.admit(now, BigInt(call.partition), BigInt(call['window-ms']), BigInt(call['estimate-hashes']));
    case 'hydrate': {
      const h = call.hydration;
      const hydration = {
        partition: BigInt(h.partition),
        windowMs: BigInt(h['window-ms']),
        lastOffset: BigInt(h['last-offset']),
        rows: h.rows.map((r) => ({
          baseOffset: BigInt(r['base-offset']),
          endOffset: BigInt(r['end-offset']),
          createdMs: BigInt(r['created-ms']),
          hashes: hashBytes(r.hashes),
        })),
      };
      return hydrateJson(shard, now, hydration);
    }
    case 'expire':
      shard.expire(now);
      return undefined;
    case 'forget':
      shard.forget(BigInt(call.partition));
      return undefined;
    case 'stats':
      return statsJson(shard.stats());
    default:
      throw new Error(`unknown call ${call.call}`);
  }
}
