// Images and video end to end (issue 12 item 7): the `openai` npm client sends OpenAI image_url / video_url parts
// (data: URLs) to
// `m3serve serve --device cpu` on the demo model with random vision weights (scripts/make_demo_model.sh with
// M3_DEMO_VISION=1: the Qwen3 tokenizer plus ]<]image[>[ / ]<]video[>[ slot tokens). Random weights: the tests
// check the media path's bookkeeping — the slot and marker tokens in the prompt, the prefix cache keyed by media
// content, determinism, and a 400 for a broken file — never wording. The clips (M3_E2E_CLIPS, written by
// tests/e2e/make_clip.cpp): a.mkv and b.mkv, MPEG-4, 25 frames of 96×64 at 5 fps, different content.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, postRaw, metrics, MODEL_NAME } from './harness.mjs';

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

test('a repeated image is not encoded again (feature cache, prefix cache) and answers the same', async () => {
  const count = async () => {
    const m = await metrics(srv.baseURL);
    return [m['m3serve:media_items_total'], m['m3serve:media_items_encoded_total'],
      m['m3serve:media_items_skipped_total']];
  };
  const [items0, enc0] = await count();
  const a = await ask([text, image('rgb.gif'), image('gray.jpg')]);
  const [items1, enc1] = await count();
  assert.equal(items1 - items0, 2);
  assert.equal(enc1 - enc0, 2, 'two new images: both encoded');
  // Another turn with the same two images and a new one: only the new one runs through the encoder.
  const b = await ask([text, image('gray.jpg'), image('q90_420.jpg'), image('rgb.gif')]);
  const [items2, enc2] = await count();
  assert.equal(items2 - items1, 3);
  assert.equal(enc2 - enc1, 1, 'only the new image is encoded');
  const [, , skipped2] = await count();
  const again = await ask([text, image('rgb.gif'), image('gray.jpg')]);
  const [, enc3, skipped3] = await count();
  assert.equal(enc3, enc2, 'nothing new to encode');
  // The prefix cache holds the first turn's pages, both images' slots among them: the engine never asks for them.
  assert.equal(skipped3 - skipped2, 2, 'both images inside the cached prefix');
  assert.equal(again.choices[0].message.content, a.choices[0].message.content, 'cached features: the same answer');
  assert.equal(again.usage.prompt_tokens, a.usage.prompt_tokens);
  assert.ok(b.usage.prompt_tokens > a.usage.prompt_tokens);
});

test('a broken image is a 400 naming the media, and the server keeps serving', async () => {
  await assert.rejects(
    ask([text, { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUg' } }]),
    (e) => e.status === 400 && /invalid_media/.test(JSON.stringify(e.error ?? e.message)));
  const ok = await ask([text, image('p.png')]);
  assert.equal(ok.choices.length, 1);
});

// --- video -------------------------------------------------------------------------------------------------------
const clipUrl = (name) => {
  const dir = process.env.M3_E2E_CLIPS;
  if (!dir) throw new Error('set M3_E2E_CLIPS (ctest does)');
  return 'data:video/x-matroska;base64,' + fs.readFileSync(path.join(dir, name)).toString('base64');
};
const video = (name) => ({ type: 'video_url', video_url: { url: clipUrl(name) } });
const vtext = { type: 'text', text: 'What happens in the video?' };

async function tokenize(body) {
  const r = await postRaw(srv.baseURL, '/tokenize', JSON.stringify(body));
  assert.equal(r.status, 200, r.text);
  return r.json.tokens;
}
const tokenId = async (s) => {
  const ids = await tokenize({ prompt: s, add_special_tokens: false });
  assert.equal(ids.length, 1, `${s} must be one token: ${ids}`);
  return ids[0];
};
const count = (ids, id) => ids.filter((x) => x === id).length;
async function detokenize(tokens) {
  const r = await postRaw(srv.baseURL, '/detokenize', JSON.stringify({ tokens }));
  assert.equal(r.status, 200, r.text);
  return r.json.prompt;
}

test('a video expands into timestamped groups of slot tokens, is deterministic and keys the prefix cache', async () => {
  const vid = await tokenId(']<]video[>[');
  const img = await tokenId(']<]image[>[');
  // 25 frames at 5 fps sampled at 1 fps: frames 0, 5, 10, 15, 20 (+ the last repeated) → 3 temporal groups stamped
  // with frames 0, 10, 20; each 96×64 frame resizes to 84×56 → 6×4 patches → 6 slots per group (docs/MEDIA.md).
  const expansion = ['0.0', '2.0', '4.0']
    .map((ts) => `]<]${ts} seconds[>[]<]start of image[>[` + ']<]video[>['.repeat(6) + ']<]end of image[>[')
    .join('');
  const msgs = (parts) => ({ model: MODEL_NAME, messages: [{ role: 'user', content: parts }] });
  const ids = await tokenize(msgs([vtext, video('a.mkv')]));  // /tokenize runs the media gateway too
  assert.equal(count(ids, vid), 18, 'three groups of six video slots');
  assert.equal(count(ids, img), 0);
  // The prompt is the text-only prompt with the expansion where the video part was, and nothing else.
  const plainText = await detokenize(await tokenize(msgs([vtext])));
  assert.equal(await detokenize(ids), plainText.replace(vtext.text, vtext.text + expansion));

  const ask2 = (parts) => client.chat.completions.create({ model: MODEL_NAME, max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: parts }] });
  const plain = await ask2([vtext]);
  const a = await ask2([vtext, video('a.mkv')]);
  const b = await ask2([vtext, video('a.mkv')]);
  assert.equal(a.usage.prompt_tokens, ids.length);
  assert.equal(b.usage.prompt_tokens, a.usage.prompt_tokens);
  assert.equal(b.choices[0].message.content, a.choices[0].message.content, 'greedy: same video, same answer');
  assert.ok(b.usage.prompt_tokens_details.cached_tokens > plain.usage.prompt_tokens_details.cached_tokens + 8,
    JSON.stringify(b.usage));
  // b.mkv: same size and length, so the same token ids, but other frames: the video's pages must not be reused.
  const other = await ask2([vtext, video('b.mkv')]);
  assert.equal(other.usage.prompt_tokens, a.usage.prompt_tokens);
  assert.ok(other.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens_details.cached_tokens,
    `another video must not reuse the first video's pages: ${JSON.stringify(other.usage)}`);
});

test('a broken or truncated video is a 400 naming the media, and the server keeps serving', async () => {
  const whole = clipUrl('a.mkv');
  const truncated = whole.slice(0, 'data:video/x-matroska;base64,'.length + 400);
  for (const url of ['data:video/mp4;base64,AAAAIGZ0eXBpc29tAAACAGlzb21pc28y', truncated]) {
    await assert.rejects(
      client.chat.completions.create({ model: MODEL_NAME, max_tokens: 2,
        messages: [{ role: 'user', content: [vtext, { type: 'video_url', video_url: { url } }] }] }),
      (e) => e.status === 400 && /invalid_media/.test(JSON.stringify(e.error ?? e.message)) &&
        /video/.test(JSON.stringify(e.error ?? e.message)));
  }
  const ok = await client.chat.completions.create({ model: MODEL_NAME, max_tokens: 2,
    messages: [{ role: 'user', content: [vtext, video('a.mkv')] }] });
  assert.equal(ok.choices.length, 1);
});

test('a request with 8 images carries every image in order', async () => {
  const names = ['p.png', 'l.png', 'la.png', 'rgba.png', 'rgb16.png', 'i16.png', 'one_bit.png', 'p_trns.png'];
  const img = await tokenId(']<]image[>[');
  const parts = [text, ...names.map(image)];
  const ids = await tokenize({ model: MODEL_NAME, messages: [{ role: 'user', content: parts }] });
  // Each 61×45 file resizes to 56×56 → 4×4 patches → 4 slots.
  assert.equal(count(ids, img), 32);
  const r = await ask(parts);
  assert.equal(r.usage.prompt_tokens, ids.length);
  const again = await ask(parts);
  assert.equal(again.choices[0].message.content, r.choices[0].message.content);
  assert.ok(again.usage.prompt_tokens_details.cached_tokens >= ids.length - 16, JSON.stringify(again.usage));
  // The same images in another order: same ids, other content at each place → the cache stops at the first image.
  const swapped = await ask([text, ...[...names].reverse().map(image)]);
  assert.equal(swapped.usage.prompt_tokens, ids.length);
  assert.ok(swapped.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens_details.cached_tokens,
    JSON.stringify(swapped.usage));
});
