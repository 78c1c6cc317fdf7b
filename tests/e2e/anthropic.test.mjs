// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) end to end, driven by the official
// `@anthropic-ai/sdk` client against `m3serve serve` with the demo model (random weights: structure, counts and
// agreement between forms are checked, never wording).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, waitIdle, postRaw, MODEL_NAME } from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const requireNpm = createRequire(path.join(here, '..', 'npm', 'package.json'));
const sdk = requireNpm('@anthropic-ai/sdk');
const Anthropic = sdk.default ?? sdk.Anthropic ?? sdk;

const KEY = 'sk-e2e-anthropic';
let srv;
let client;

before(async () => {
  srv = await startServer(['--max-model-len', '1024', '--max-num-seqs', '8', '--api-key', KEY]);
  client = new Anthropic({ baseURL: srv.baseURL, apiKey: KEY, maxRetries: 0, timeout: 120000 });
});

after(async () => {
  if (srv) {
    const code = await srv.stop();
    assert.equal(code, 0, `server exit status ${code}\n${srv.stderr()}`);
  }
});

const tools = [{ name: 'get_weather', description: 'Weather for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];

const roundTrip = [
  { role: 'user', content: 'Weather in Paris?' },
  { role: 'assistant', content: [{ type: 'text', text: 'Let me check.' },
    { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Paris' } }] },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: '{"temp": 21}' },
    { type: 'text', text: 'Thanks. And Rome?' }] },
];

test('messages, non-streaming: the Anthropic message shape, usage, x-api-key auth', async () => {
  const m = await client.messages.create({ model: MODEL_NAME, max_tokens: 8, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hello!' }], temperature: 0, metadata: { user_id: 'e2e' } });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, MODEL_NAME);
  assert.match(m.id, /^msg_/);
  assert.ok(Array.isArray(m.content));
  for (const b of m.content) assert.ok(['text', 'thinking', 'tool_use'].includes(b.type), JSON.stringify(b));
  assert.ok(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'].includes(m.stop_reason));
  assert.ok(m.usage.input_tokens + m.usage.cache_read_input_tokens > 0);
  assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= 8);
});

test('messages, streaming: event order and the stream folds to the same message as non-streaming', async () => {
  const params = { model: MODEL_NAME, max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: 'Count.' }] };
  const stream = client.messages.stream(params);
  const types = [];
  stream.on('streamEvent', (e) => types.push(e.type));
  const final = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-2), 'message_delta');
  assert.equal(types.at(-1), 'message_stop');
  // Between message_start and message_delta: ping, then whole blocks (start, deltas, stop), never interleaved.
  let open = false;
  for (const t of types.slice(1, -2)) {
    if (t === 'content_block_start') { assert.equal(open, false); open = true; }
    else if (t === 'content_block_delta') assert.equal(open, true);
    else if (t === 'content_block_stop') { assert.equal(open, true); open = false; }
    else assert.equal(t, 'ping');
  }
  assert.equal(open, false);
  const plain = await client.messages.create(params);
  assert.deepEqual(final.content, plain.content);  // temperature 0: same tokens, same blocks
  assert.equal(final.stop_reason, plain.stop_reason);
  assert.equal(final.usage.output_tokens, plain.usage.output_tokens);
});

test('tool round trip: tool_use / tool_result render, count_tokens equals the prompt the request runs', async () => {
  const m = await client.messages.create({ model: MODEL_NAME, max_tokens: 4, tools, messages: roundTrip,
    tool_choice: { type: 'auto' } });
  const prompt = m.usage.input_tokens + m.usage.cache_read_input_tokens;
  const count = await client.messages.countTokens({ model: MODEL_NAME, tools, messages: roundTrip });
  assert.equal(count.input_tokens, prompt);
  const plain = await client.messages.countTokens({ model: MODEL_NAME, messages: [{ role: 'user', content: 'x' }] });
  assert.ok(count.input_tokens > plain.input_tokens + 10);
  // tool_choice none keeps tool markup as text: no tool_use block comes back.
  const none = await client.messages.create({ model: MODEL_NAME, max_tokens: 4, tools, messages: roundTrip,
    tool_choice: { type: 'none' } });
  assert.ok(none.content.every((b) => b.type !== 'tool_use'));
});

test('stop_sequences and thinking are accepted; any/tool tool_choice are constrained decoding', async () => {
  const m = await client.messages.create({ model: MODEL_NAME, max_tokens: 16, stop_sequences: ['e', 'a'],
    thinking: { type: 'enabled', budget_tokens: 1024 }, messages: [{ role: 'user', content: 'Go' }] });
  assert.ok(['end_turn', 'max_tokens', 'stop_sequence'].includes(m.stop_reason));
  if (m.stop_reason === 'stop_sequence') assert.ok(['e', 'a'].includes(m.stop_sequence));
  const any = await client.messages.create({ model: MODEL_NAME, max_tokens: 32, tools,
    tool_choice: { type: 'any' }, messages: [{ role: 'user', content: 'x' }] });
  assert.ok(['max_tokens', 'tool_use'].includes(any.stop_reason));
  await assert.rejects(client.messages.create({ model: MODEL_NAME, max_tokens: 4,
    tool_choice: { type: 'any' }, messages: [{ role: 'user', content: 'x' }] }),
  (e) => e.status === 400 && e.error?.type === 'error' && e.error?.error?.type === 'invalid_request_error');
});

test('malformed bodies get Anthropic error JSON and the server keeps serving', async () => {
  const auth = { 'x-api-key': KEY };
  const badBoth = ['{', '[]', '{}', '{"max_tokens":4}', '{"max_tokens":4,"messages":[{"role":"system","content":"x"}]}',
    '{"max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}',
    '{"max_tokens":4,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]}',
    '['.repeat(5000) + ']'.repeat(5000)];
  // Generation fields: wrong for /v1/messages, not read by count_tokens.
  const badMessages = ['{"max_tokens":0,"messages":[{"role":"user","content":"x"}]}',
    '{"messages":[{"role":"user","content":"x"}]}',
    '{"max_tokens":4,"temperature":3,"messages":[{"role":"user","content":"x"}]}',
    '{"max_tokens":99999,"messages":[{"role":"user","content":"x"}]}'];
  const cases = [...badBoth.flatMap((b) => [['/v1/messages', b], ['/v1/messages/count_tokens', b]]),
    ...badMessages.map((b) => ['/v1/messages', b])];
  for (const [route, body] of cases) {
    const r = await postRaw(srv.baseURL, route, body, auth);
    assert.equal(r.status, 400, `${route} ${body.slice(0, 80)} → ${r.status} ${r.text}`);
    assert.equal(r.json?.type, 'error', r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(typeof r.json.error.message, 'string');
  }
  const unknownModel = await postRaw(srv.baseURL, '/v1/messages',
    JSON.stringify({ model: 'nope', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }), auth);
  assert.equal(unknownModel.status, 404);
  assert.equal(unknownModel.json.error.type, 'not_found_error');
  const noKey = await postRaw(srv.baseURL, '/v1/messages', '{}');
  assert.equal(noKey.status, 401);
  assert.equal(noKey.json.error.type, 'authentication_error');
  const wrong = new Anthropic({ baseURL: srv.baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrong.messages.create({ model: MODEL_NAME, max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 401);
  // The OpenAI routes keep OpenAI's error shape, and Bearer still works.
  const oai = await postRaw(srv.baseURL, '/v1/chat/completions', '{', { Authorization: `Bearer ${KEY}` });
  assert.equal(oai.status, 400);
  assert.equal(typeof oai.json.error.message, 'string');
  assert.equal(oai.json.type, undefined);
  const ok = await client.messages.create({ model: MODEL_NAME, max_tokens: 2, messages: [{ role: 'user', content: 'x' }] });
  assert.equal(ok.type, 'message');
  await waitIdle(srv.baseURL);
});

test('a cancelled stream frees its engine work', async () => {
  const stream = client.messages.stream({ model: MODEL_NAME, max_tokens: 400, messages: [{ role: 'user', content: 'Long.' }] });
  let n = 0;
  for await (const e of stream) { if (e.type === 'content_block_delta' && ++n >= 2) break; }
  stream.abort();
  await waitIdle(srv.baseURL);
});
