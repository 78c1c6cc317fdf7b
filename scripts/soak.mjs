// Soak / fault test for `m3serve serve` (docs/SERVER.md "Soak test"): starts the server on 127.0.0.1 with a KV pool
// small enough to preempt, sends mixed valid and hostile traffic with random disconnects for a bounded time and
// request count, checks that no page leaked and RSS did not grow, then sends SIGTERM under load and checks every
// client got a complete answer and the process exited 0. Node built-ins only; loopback only.
//
//   node scripts/soak.mjs --bin build/bin/m3serve --model DIR [--seconds 40] [--max-requests 100000]
//        [--concurrency 12] [--seed 1] [--kv-cache-memory 1536KiB] [--rss-growth-mib 64]
// Exit status: 0 when clean; 1 on any crash, unexpected 5xx, lost request, leaked page or RSS growth.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';

const HOST = '127.0.0.1';  // never anything else: this tool attacks the server it talks to

function parseArgs(argv) {
  const o = { seconds: 40, maxRequests: 100000, concurrency: 12, seed: 1, kvCacheMemory: '1536KiB', rssGrowthMib: 64 };
  for (let i = 2; i < argv.length; i += 2) {
    const k = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(k in o) && k !== 'bin' && k !== 'model') throw new Error(`unknown option ${argv[i]}`);
    o[k] = typeof o[k] === 'number' ? Number(argv[i + 1]) : argv[i + 1];
  }
  if (!o.bin || !o.model) throw new Error('--bin and --model are required');
  return o;
}

// mulberry32: a seeded PRNG so a failing run can be repeated with the same --seed.
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Sends raw bytes on a fresh connection and reads until the server closes it (every request here says
// Connection: close) or `timeoutMs`. `disconnectAfterMs`: the client leaves early on purpose.
function exchange(port, bytes, { timeoutMs = 30000, disconnectAfterMs = -1, trickle = false } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect({ host: HOST, port });
    const chunks = [];
    let done = false;
    const finish = (how) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (early) clearTimeout(early);
      sock.destroy();
      resolve({ how, data: Buffer.concat(chunks).toString('latin1') });
    };
    const timer = setTimeout(() => finish('timeout'), timeoutMs);
    const early = disconnectAfterMs >= 0 ? setTimeout(() => finish('left'), disconnectAfterMs) : null;
    sock.on('connect', () => {
      if (!trickle) return sock.write(bytes);
      sock.write(bytes.slice(0, 10));  // slowloris: part of the header, then nothing
    });
    sock.on('data', (d) => chunks.push(d));
    sock.on('end', () => finish('closed'));
    sock.on('error', (e) => finish(e.code === 'ECONNREFUSED' ? 'refused' : 'reset'));
  });
}

function request(method, path, body = '', extra = '') {
  const b = Buffer.from(body, 'utf8');
  return Buffer.concat([Buffer.from(`${method} ${path} HTTP/1.1\r\nHost: ${HOST}\r\nConnection: close\r\n` +
    `Content-Type: application/json\r\n${extra}Content-Length: ${b.length}\r\n\r\n`, 'latin1'), b]);
}

const status = (data) => Number((/^HTTP\/1\.[01] (\d{3})/.exec(data) || [])[1] || 0);

// A complete answer: a non-streaming body of its Content-Length, or a stream with [DONE] and the last chunk.
function complete(data) {
  const head = data.indexOf('\r\n\r\n');
  if (head < 0) return false;
  const h = data.slice(0, head).toLowerCase();
  const body = data.slice(head + 4);
  if (h.includes('transfer-encoding: chunked')) return body.endsWith('\r\n0\r\n\r\n') && body.includes('data: [DONE]');
  const len = /content-length: (\d+)/.exec(h);
  return len ? Buffer.byteLength(body, 'latin1') === Number(len[1]) : false;
}

const msgs = (rnd) => [{ role: 'user', content: `soak ${Math.floor(rnd() * 1e6)} ` + 'tell me more '.repeat(1 + Math.floor(rnd() * 8)) }];

// Each kind: the bytes to send, what statuses are fine, and how the client behaves.
const KINDS = [
  ['chat_stream', 5, (r) => ({ bytes: request('POST', '/v1/chat/completions', JSON.stringify({ messages: msgs(r), max_tokens: 8 + Math.floor(r() * 40), stream: true, ignore_eos: true })), ok: [200] })],
  ['chat_stream_cancel', 2, (r) => ({ bytes: request('POST', '/v1/chat/completions', JSON.stringify({ messages: msgs(r), max_tokens: 200, stream: true, ignore_eos: true })), ok: [200], disconnectAfterMs: 50 + Math.floor(r() * 400) })],
  ['completion', 4, (r) => ({ bytes: request('POST', '/v1/completions', JSON.stringify({ prompt: msgs(r)[0].content, max_tokens: 4 + Math.floor(r() * 24), ignore_eos: true, n: 1 + Math.floor(r() * 2) })), ok: [200] })],
  ['completion_cancel_pipelined', 1, (r) => ({ bytes: Buffer.concat([request('POST', '/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 400, ignore_eos: true })).toString('latin1').replace('Connection: close\r\n', ''), request('GET', '/health')].map((x) => Buffer.from(x, 'latin1'))), ok: [200], pipelined: true, disconnectAfterMs: 100 + Math.floor(r() * 300) })],
  ['malformed_json', 1, () => ({ bytes: request('POST', '/v1/chat/completions', '{"messages": [nope'), ok: [400] })],
  ['deep_nesting', 1, () => ({ bytes: request('POST', '/v1/chat/completions', `{"messages":[{"role":"user","content":${'['.repeat(5000)}${']'.repeat(5000)}}]}`), ok: [400] })],
  ['bad_kwargs', 1, () => ({ bytes: request('POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], chat_template_kwargs: { messages: [null] } })), ok: [400] })],
  ['te_smuggle', 1, (r) => ({ bytes: Buffer.from(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ${['xchunked', 'identity', 'chunked, identity', 'gzip, chunked'][Math.floor(r() * 4)]}\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n`, 'latin1'), ok: [400, 501], single: true })],
  ['no_host', 1, () => ({ bytes: Buffer.from('GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n', 'latin1'), ok: [400] })],
  ['too_large', 1, () => ({ bytes: Buffer.from(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n`, 'latin1'), ok: [413] })],
  ['too_long', 1, () => ({ bytes: request('POST', '/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 10000000 })), ok: [400] })],
  ['slowloris', 1, () => ({ bytes: request('GET', '/health'), ok: [0], trickle: true, timeoutMs: 5000 })],
  ['health', 1, () => ({ bytes: request('GET', '/health'), ok: [200] })],
  ['metrics', 1, () => ({ bytes: request('GET', '/metrics'), ok: [200] })],
];
const TOTAL_WEIGHT = KINDS.reduce((s, k) => s + k[1], 0);
function pick(rnd) {
  let x = rnd() * TOTAL_WEIGHT;
  for (const k of KINDS) if ((x -= k[1]) < 0) return k;
  return KINDS[0];
}

const rssKiB = (pid) => Number((/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8')) || [])[1] || 0);
async function metric(port, name) {
  const r = await exchange(port, request('GET', '/metrics'), { timeoutMs: 5000 });
  const m = new RegExp(`^m3serve:${name}\\{[^}]*\\} (\\S+)`, 'm').exec(r.data);
  return m ? Number(m[1]) : NaN;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const o = parseArgs(process.argv);
  const rnd = prng(o.seed);
  const problems = [];
  const server = spawn(o.bin, ['serve', '--model', o.model, '--host', HOST, '--port', '0', '--kv-cache-memory', o.kvCacheMemory,
    '--max-num-seqs', '8', '--max-body-bytes', '1MiB', '--shutdown-timeout', '2', '--header-timeout', '1', '--quiet'],
  { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  server.stderr.on('data', (d) => { stderr = (stderr + d).slice(-20000); });
  let exited = null;
  const exitP = new Promise((r) => server.on('exit', (code, signal) => { exited = { code, signal }; r(exited); }));
  const port = await new Promise((resolve, reject) => {
    let out = '';
    server.stdout.on('data', (d) => {
      out += d;
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    });
    exitP.then(() => reject(new Error(`server exited before listening: ${JSON.stringify(exited)}\n${stderr}`)));
  });

  const tStart = Date.now();
  const phases = {};
  const mark = (name) => { phases[name] = Date.now() - tStart; };
  mark('listening');
  const counts = {};
  const stats = { requests: 0, errors: 0, left: 0, fivexx: 0, lost: 0 };
  const note = (kind, msg) => { stats.errors++; if (problems.length < 30) problems.push(`${kind}: ${msg}`); };
  const deadline = Date.now() + o.seconds * 1000;
  let rss0 = 0;
  const worker = async () => {
    while (Date.now() < deadline && stats.requests < o.maxRequests && exited === null) {
      const [kind, , make] = pick(rnd);
      const t = make(rnd);
      stats.requests++;
      counts[kind] = (counts[kind] || 0) + 1;
      const r = await exchange(port, t.bytes, { disconnectAfterMs: t.disconnectAfterMs ?? -1, trickle: t.trickle, timeoutMs: t.timeoutMs ?? 30000 });
      const s = status(r.data);
      if (s >= 500 && !t.ok.includes(s)) { stats.fivexx++; note(kind, `status ${s}: ${r.data.slice(0, 200)}`); continue; }
      if (r.how === 'left') { stats.left++; continue; }  // we hung up on purpose; anything received so far is fine
      if (t.trickle) { if (r.how !== 'closed') note(kind, `slow header not cut off (${r.how})`); continue; }
      if (t.pipelined && r.how === 'closed' && s === 200) continue;  // finished before we left: fine
      if (r.how !== 'closed' || !complete(r.data)) { stats.lost++; note(kind, `no complete answer (${r.how}): ${r.data.slice(0, 200)}`); continue; }
      if (!t.ok.includes(s)) note(kind, `status ${s}, expected ${t.ok}: ${r.data.slice(0, 300)}`);
      if (t.single && (r.data.match(/HTTP\/1\.1 /g) || []).length !== 1) note(kind, 'a smuggled request was answered');
    }
  };
  // Warm up (allocator pools, prefix cache) before the RSS baseline.
  await Promise.all(Array.from({ length: 4 }, () => exchange(port, request('POST', '/v1/completions', JSON.stringify({ prompt: 'warm up', max_tokens: 8 })))));
  rss0 = rssKiB(server.pid);
  mark('warm');
  await Promise.all(Array.from({ length: o.concurrency }, worker));
  mark('traffic_done');

  // Idle: every page must come back and nothing may be running.
  let pages = NaN, running = NaN;
  for (let i = 0; i < 50; i++) {
    pages = await metric(port, 'kv_pages_used');
    running = await metric(port, 'num_requests_running');
    if (pages === 0 && running === 0) break;
    await sleep(100);
  }
  mark('idle');
  const preemptions = await metric(port, 'num_preemptions_total');
  const rss1 = exited === null ? rssKiB(server.pid) : 0;
  if (pages !== 0) problems.push(`kv_pages_used is ${pages} when idle (leak)`);
  if (running !== 0) problems.push(`num_requests_running is ${running} when idle`);
  const growthMiB = (rss1 - rss0) / 1024;
  if (growthMiB > o.rssGrowthMib) problems.push(`RSS grew ${growthMiB.toFixed(1)} MiB (limit ${o.rssGrowthMib})`);

  // SIGTERM under load: long streams and non-streaming requests in flight; each must get a complete answer.
  const inflight = [];
  for (let i = 0; i < 6; i++) {
    const stream = i % 2 === 0;
    inflight.push(exchange(port, request('POST', '/v1/completions', JSON.stringify({ prompt: `bye ${i}`, max_tokens: 300, ignore_eos: true, stream })), { timeoutMs: 20000 })
      .then((r) => ({ r, stream })));
  }
  await sleep(1000);
  const t0 = Date.now();
  if (exited === null) server.kill('SIGTERM');
  await sleep(300);  // the listener closes as soon as the signal is handled
  const late = await exchange(port, request('GET', '/v1/models'), { timeoutMs: 5000 }).catch(() => null);
  for (const { r, stream } of await Promise.all(inflight)) {
    const s = status(r.data);
    if (r.how !== 'closed' || !complete(r.data)) { stats.lost++; problems.push(`shutdown: ${stream ? 'stream' : 'request'} without a complete answer (${r.how}): ${r.data.slice(-200)}`); continue; }
    if (stream && !/"finish_reason":"(abort|length)"/.test(r.data)) problems.push('shutdown: stream without a finish_reason');
    if (!stream && s !== 200 && s !== 503) problems.push(`shutdown: non-streaming status ${s}`);
  }
  if (late && status(late.data) === 200) problems.push('shutdown: a connection made after SIGTERM was served');
  const ex = await Promise.race([exitP, sleep(15000).then(() => null)]);
  const shutdownMs = Date.now() - t0;
  if (!ex) { server.kill('SIGKILL'); problems.push('shutdown: the server did not exit within 15 s'); }
  else if (ex.code !== 0) problems.push(`shutdown: exit ${JSON.stringify(ex)} (crash?)\n${stderr.slice(-3000)}`);

  mark('exited');
  const report = { seconds: o.seconds, seed: o.seed, phases_ms: phases, ...stats, by_kind: counts, kv_pages_used_idle: pages, preemptions,
    rss_start_mib: +(rss0 / 1024).toFixed(1), rss_end_mib: +(rss1 / 1024).toFixed(1), shutdown_ms: shutdownMs,
    exit: ex, problems };
  console.log(JSON.stringify(report, null, 1));
  if (problems.length || stats.errors) {
    console.error(`soak: FAILED (${problems.length + stats.errors} problems)`);
    process.exit(1);
  }
  console.error(`soak: ok — ${stats.requests} requests, ${stats.left} client disconnects, ${preemptions} preemptions, 0 pages in use after, RSS ${growthMiB.toFixed(1)} MiB growth, clean SIGTERM in ${shutdownMs} ms`);
  process.exit(0);  // do not wait for the 15 s exit guard timer
}

main().catch((e) => { console.error(e); process.exit(1); });
