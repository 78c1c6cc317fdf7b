// Load test (bounded, loopback only): ≥ 64 concurrent streams, ≥ 500 requests, a fraction cancelled at random.
// Every request must finish or be cancelled, the engine must end with zero KV pages in use, and the server must
// still answer afterwards. The concurrency is the server's own count (/metrics: requests running + waiting in the
// engine), read once the first 64 long streams have all produced a token and before any of them may end.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, waitIdle, metrics, MODEL_NAME } from './harness.mjs';

const TOTAL = Number(process.env.M3_E2E_LOAD_REQUESTS ?? 500);
const CONCURRENCY = 64;
const CANCEL_FRACTION = 0.2;
// The first CONCURRENCY streams are long enough (greedy, cheap to sample) that all are in the engine together.
const HOLD_TOKENS = 48;

let srv;
before(async () => {
  srv = await startServer(['--max-model-len', '512', '--max-num-seqs', '64', '--max-connections', '512',
    '--max-num-batched-tokens', '1024']);
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, srv.stderr());
});

// Deterministic pseudo-random numbers (the test is reproducible).
let state = 12345;
const rand = () => { state = (state * 1103515245 + 12345) % 2147483648; return state / 2147483648; };

test(`load: ${TOTAL} requests at concurrency ${CONCURRENCY}, ${CANCEL_FRACTION * 100}% cancelled`, async () => {
  const client = srv.client;
  let next = 0;
  let inflight = 0;
  let peak = 0;
  // The first CONCURRENCY streams each wait here after their first chunk; the last one to arrive reads the
  // server's metrics, then releases them all.
  let firstChunks = 0;
  let serverConcurrency = -1;
  let release;
  const allStarted = new Promise((r) => { release = r; });
  async function startedOne() {
    if (++firstChunks < CONCURRENCY) return;
    const m = await metrics(srv.baseURL);
    serverConcurrency = m['m3serve:num_requests_running'] + m['m3serve:num_requests_waiting'];
    release();
  }
  const counts = { done: 0, cancelled: 0, streamed: 0 };
  const errors = [];

  async function one(i) {
    // The first CONCURRENCY requests are long completion streams, so they are all in the engine at once.
    const held = i < CONCURRENCY;
    const kind = held ? 0.7 : rand();
    const cancel = rand() < CANCEL_FRACTION;
    const cancelAfter = (held ? 1 : 0) + 1 + Math.floor(rand() * 3);
    const maxTokens = held ? HOLD_TOKENS : 1 + Math.floor(rand() * 4);
    const controller = new AbortController();
    const prompt = `Request ${i}: ${'tell me more '.repeat(1 + (i % 7))}`;
    inflight++;
    peak = Math.max(peak, inflight);
    try {
      if (kind < 0.8) {
        counts.streamed++;
        const stream = kind < 0.6
          ? await client.chat.completions.create({ model: MODEL_NAME, messages: [{ role: 'user', content: prompt }],
            max_tokens: maxTokens, stream: true, ignore_eos: true, temperature: 0.7, seed: i },
          { signal: controller.signal })
          : await client.completions.create({ model: MODEL_NAME, prompt, max_tokens: maxTokens, stream: true,
            ignore_eos: true, ...(held ? { temperature: 0 } : {}) }, { signal: controller.signal });
        let chunks = 0;
        let first = true;
        let finish = null;
        let broke = false;
        // Cancel by leaving the loop: the client then aborts the HTTP request (closes the connection).
        // (controller.abort() inside the loop can leave openai v6's iterator waiting forever when the body has
        // already been fully received.)
        for await (const chunk of stream) {
          if (held && first) { first = false; await startedOne(); await allStarted; }
          for (const c of chunk.choices) if (c.finish_reason) finish = c.finish_reason;
          if (cancel && ++chunks === cancelAfter) { broke = true; break; }
        }
        if (broke) counts.cancelled++;
        else { assert.equal(finish, 'length'); counts.done++; }
      } else {
        if (cancel) setTimeout(() => controller.abort(), Math.floor(rand() * 30));
        try {
          const r = await client.completions.create({ model: MODEL_NAME, prompt, max_tokens: maxTokens,
            ignore_eos: true }, { signal: controller.signal });
          assert.equal(r.usage.completion_tokens, maxTokens);
          counts.done++;
        } catch (e) {
          if (!controller.signal.aborted) throw e;
          counts.cancelled++;
        }
      }
    } catch (e) {
      errors.push(`request ${i}: ${e.message}`);
    } finally {
      inflight--;
    }
  }

  // A request that hangs fails the test with its index instead of hanging the suite.
  const watchdog = (i) => new Promise((_, reject) => setTimeout(() => reject(new Error(`request ${i} hung`)), 90000).unref());
  async function worker() {
    while (next < TOTAL) {
      const i = next++;
      try { await Promise.race([one(i), watchdog(i)]); } catch (e) { errors.push(e.message); }
    }
  }
  const t0 = Date.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  const secs = (Date.now() - t0) / 1000;
  console.log(`load: ${counts.done} finished, ${counts.cancelled} cancelled, ${errors.length} errors, ` +
    `peak ${peak} in flight on the client, ${serverConcurrency} in the server's engine at once, ${secs.toFixed(1)} s`);
  assert.deepEqual(errors, []);
  assert.equal(counts.done + counts.cancelled, TOTAL);
  assert.ok(counts.cancelled > 0 && counts.done > 0);
  assert.ok(serverConcurrency >= CONCURRENCY, `the server saw ${serverConcurrency} concurrent requests`);

  const m = await waitIdle(srv.baseURL, 60000);
  assert.equal(m['m3serve:kv_pages_used'], 0);
  assert.equal(m['m3serve:num_requests_running'], 0);
  // The server still answers.
  const r = await client.completions.create({ model: MODEL_NAME, prompt: 'still there?', max_tokens: 3,
    ignore_eos: true });
  assert.equal(r.usage.completion_tokens, 3);
  // The engine publishes its metrics after the step that finished the request: wait for the snapshot.
  const after = await waitIdle(srv.baseURL, 10000);
  assert.equal(after['m3serve:kv_pages_used'], 0);
  assert.ok(after['m3serve:http_client_disconnects_total'] > 0);
});
