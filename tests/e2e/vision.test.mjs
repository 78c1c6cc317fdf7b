// Images end to end (issue 12 item 7): the `openai` npm client sends OpenAI image_url parts (data: URLs) to
// `m3serve serve --device cpu` on the demo model with random vision weights (scripts/make_demo_model.sh with
// M3_DEMO_VISION=1: the Qwen3 tokenizer plus ]<]image[>[ / ]<]video[>[ slot tokens). Random weights: the tests
// check the media path's bookkeeping — the image's slot tokens in the prompt, the prefix cache keyed by image
// content, determinism, and a 400 for a broken image — never wording.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, MODEL_NAME } from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const template = path.join(here, '..', 'chat_template', 'm3_format_synthetic.jinja');
const dataUrl = (name) =>
  'data:image/png;base64,' + fs.readFileSync(path.join(here, '..', 'media', 'fixtures', 'files', name)).toString('base64');

let srv;
let client;

before(async () => {
  srv = await startServer(['--device', 'cpu', '--chat-template', template, '--max-model-len', '2048']);
  client = srv.client;
});

after(async () => {
  if (srv) {
    const code = await srv.stop();
    assert.equal(code, 0, `server exit status ${code}\n${srv.stderr()}`);
  }
});

const ask = (parts) =>
  client.chat.completions.create({ model: MODEL_NAME, max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: parts }] });
const text = { type: 'text', text: 'What is in the image?' };
const image = (name) => ({ type: 'image_url', image_url: { url: dataUrl(name) } });

test('an image adds its slot tokens to the prompt and a repeated image hits the prefix cache', async () => {
  const plain = await ask([text]);
  const a = await ask([text, image('p.png')]);
  const b = await ask([text, image('p.png')]);
  assert.ok(a.usage.prompt_tokens > plain.usage.prompt_tokens, `${a.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
  assert.equal(b.usage.prompt_tokens, a.usage.prompt_tokens);
  assert.equal(b.choices[0].message.content, a.choices[0].message.content, 'greedy: same image, same answer');
  // The pages holding the image's slots are reused only for the same image content.
  assert.ok(b.usage.prompt_tokens_details.cached_tokens > plain.usage.prompt_tokens_details.cached_tokens + 8,
    JSON.stringify(b.usage));
  const other = await ask([text, image('l.png')]);
  assert.ok(other.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens_details.cached_tokens,
    `another image must not reuse the first image's pages: ${JSON.stringify(other.usage)}`);
});

test('a broken image is a 400 naming the media, and the server keeps serving', async () => {
  await assert.rejects(
    ask([text, { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUg' } }]),
    (e) => e.status === 400 && /invalid_media/.test(JSON.stringify(e.error ?? e.message)));
  const ok = await ask([text, image('p.png')]);
  assert.equal(ok.choices.length, 1);
});
