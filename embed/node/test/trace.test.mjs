// Replays tests/trace/cache-trace.json (recorded from stile's native core)
// against the component transpiled by jco, and requires identical answers.
// Run `npm run transpile` first (embed/run-tests.sh does).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { cache } from '../generated/stile_dedup.js';
import { perform, shardConfig } from '../cache.mjs';

const trace = JSON.parse(readFileSync(new URL('../../../tests/trace/cache-trace.json', import.meta.url), 'utf8'));

test('the trace is the format this host reads', () => {
  assert.equal(trace.format, 'stile-dedup-trace');
  assert.equal(trace.version, 1);
  assert.equal(trace.interface, 'stile:dedup/cache@0.1.0');
  assert.ok(trace.calls.length > 50);
});

test('the component answers every call of the trace as the native core did', () => {
  const shard = new cache.Shard(shardConfig(trace.config));
  try {
    trace.calls.forEach((call, index) => {
      const actual = perform(shard, call);
      const where = `call #${index} (${call.call})${call.note ? ` [${call.note}]` : ''}`;
      if ('expect' in call) {
        assert.deepStrictEqual(actual, call.expect, where);
      } else {
        assert.equal(actual, undefined, where);
      }
    });
  } finally {
    shard[Symbol.dispose]();
  }
});

test('shards are independent', () => {
  const config = shardConfig(trace.config);
  const a = new cache.Shard(config);
  const b = new cache.Shard(config);
  try {
    const hydrate = trace.calls.find((call) => call.call === 'hydrate' && 'ok' in call.expect);
    perform(a, hydrate);
    assert.equal(perform(a, { call: 'stats' }).entries, 1);
    assert.equal(perform(b, { call: 'stats' }).entries, 0);
  } finally {
    a[Symbol.dispose]();
    b[Symbol.dispose]();
  }
});

test('the transpiled component needs no runtime package: it imports nothing', () => {
  const js = readFileSync(new URL('../generated/stile_dedup.js', import.meta.url), 'utf8');
  assert.deepEqual(js.match(/^import .*$/gm) ?? [], []);
});
