// Starts `m3serve serve` on a free loopback port and hands out an `openai` client for it.
// Env (set by tests/e2e/CMakeLists.txt): M3SERVE_BIN (the binary), M3_E2E_MODEL (model directory).
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const requireNpm = createRequire(path.join(here, '..', 'npm', 'package.json'));
export const OpenAI = requireNpm('openai').default ?? requireNpm('openai');

export const MODEL_NAME = 'm3-e2e';

export async function startServer(extraArgs = []) {
  const bin = process.env.M3SERVE_BIN;
  const model = process.env.M3_E2E_MODEL;
  if (!bin || !model) throw new Error('set M3SERVE_BIN and M3_E2E_MODEL (ctest does)');
  const args = ['serve', '--model', model, '--served-model-name', MODEL_NAME, '--host', '127.0.0.1', '--port', '0',
    ...extraArgs];
  const proc = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d.toString(); if (stderr.length > 1e5) stderr = stderr.slice(-5e4); });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`server did not start in 60 s\n${stderr}`)), 60000);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited with ${code}\n${stderr}`)); });
  });
  const baseURL = `http://127.0.0.1:${port}`;
  const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  return {
    port, baseURL, client, proc,
    stderr: () => stderr,
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      const exited = new Promise((r) => proc.on('exit', (code, sig) => r(code ?? sig)));
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
      const code = await exited;
      clearTimeout(t);
      return code;
    },
  };
}

// Prometheus text → { 'name': value } (labels dropped; histogram buckets skipped).
export async function metrics(baseURL) {
  const text = await (await fetch(`${baseURL}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#') || line.includes('_bucket{')) continue;
    const m = line.match(/^([^{\s]+)(\{[^}]*\})?\s+(\S+)$/);
    if (!m) continue;
    const key = m[1] + (m[1].startsWith('m3serve:request_success_total') || m[1].startsWith('m3serve:http_requests_total') ? m[2] : '');
    out[key] = Number(m[3]);
  }
  return out;
}

// Waits until the engine has no running/waiting request and no page in use.
export async function waitIdle(baseURL, timeoutMs = 30000) {
  const t0 = Date.now();
  let m;
  while (Date.now() - t0 < timeoutMs) {
    m = await metrics(baseURL);
    if (m['m3serve:num_requests_running'] === 0 && m['m3serve:num_requests_waiting'] === 0 &&
        m['m3serve:kv_pages_used'] === 0) return m;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`engine not idle after ${timeoutMs} ms: ${JSON.stringify(m)}`);
}

export async function postRaw(baseURL, route, body, headers = {}) {
  const res = await fetch(`${baseURL}${route}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body,
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, text, json };
}
