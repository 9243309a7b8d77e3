// Call overhead of stile's dedup cache component in Node (jco): a `stats`
// call (the floor of a call's cost) and `plan` of one segment of 64 and
// 1,024 fresh hashes, against an empty partition (the cost of crossing into
// the component) and against one holding 65,536 hashes. `npm run transpile`
// first.
//
//   node bench.mjs [seconds-per-case, default 0.5]

import { createHash } from 'node:crypto';

import { cache } from './generated/stile_dedup.js';

const seconds = Number(process.argv[2] ?? 0.5);

// Any 16 bytes per message will do for timing; the real thing is xxh3-128
// of the transactionId, big-endian.
function hashes(prefix, count) {
  const out = new Uint8Array(count * 16);
  for (let i = 0; i < count; i++) {
    out.set(createHash('md5').update(`${prefix}-${i}`).digest(), i * 16);
  }
  return out;
}

function time(f) {
  for (let i = 0; i < 200; i++) f();
  let calls = 0;
  const start = process.hrtime.bigint();
  const deadline = start + BigInt(Math.round(seconds * 1e9));
  let now = start;
  while (now < deadline) {
    for (let i = 0; i < 64; i++) f();
    calls += 64;
    now = process.hrtime.bigint();
  }
  return Number(now - start) / calls;
}

const now = BigInt(Date.now());
const windowMs = 3_600_000n;
const [empty, held] = [8n, 9n];
const shard = new cache.Shard({ budgetBytes: 256n << 20n, skewSlackMs: 5000 });
shard.hydrate(now, { partition: empty, windowMs, lastOffset: -1n, rows: [] });
const rows = [];
for (let row = 0; row < 16; row++) {
  rows.push({
    baseOffset: BigInt(row * 4096),
    endOffset: BigInt(row * 4096 + 4095),
    createdMs: now,
    hashes: hashes(`held-${row}`, 4096),
  });
}
shard.hydrate(now, { partition: held, windowMs, lastOffset: 65535n, rows });

const ns = (value, width) => value.toFixed(0).padStart(width);
console.log(`benchmark: one shard in node ${process.version} (jco-transpiled)`);
console.log(`  stats()                                 ${ns(time(() => shard.stats()), 9)} ns/call`);
const boundary = [];
for (const [partition, what, pVerified] of [[empty, 'empty partition', -1n], [held, '65,536 held', 65535n]]) {
  for (const size of [64, 1024]) {
    const segments = [{ partition, windowMs, hashes: hashes('fresh', size) }];
    const perCall = time(() => {
      const [plan] = shard.plan(now, segments);
      if (plan.pVerified !== pVerified) throw new Error(`expected p-verified ${pVerified}, got ${plan.pVerified}`);
    });
    if (partition === empty) boundary.push([size, perCall]);
    const perHash = (perCall / size).toFixed(1).padStart(7);
    const label = `plan, ${what}, 1 x ${String(size).padStart(5)} hashes`;
    console.log(`  ${label.padEnd(40)}${ns(perCall, 9)} ns/call ${perHash} ns/hash`);
  }
}
const [[n1, t1], [n2, t2]] = boundary;
const perHash = (t2 - t1) / (n2 - n1);
console.log(`  crossing (empty partition): ${(t1 - perHash * n1).toFixed(0)} ns per plan call + ${perHash.toFixed(1)} ns per hash`);
shard[Symbol.dispose]();
