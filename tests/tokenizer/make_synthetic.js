#!/usr/bin/env node
// Writes small synthetic tokenizer.json files that exercise components the four real files do not use
// (Metaspace, byte fallback, unk, Prepend/Replace/NFC normalizers, Digits, literal Split
// behaviours, TemplateProcessing, ByteFallback/Fuse/Strip/Replace/Metaspace decoders, lstrip/rstrip/
// single_word/normalized added tokens, merges as [a, b] pairs, ignore_merges). Merges are learned with a
// plain BPE trainer on /usr/share/common-licenses/GPL-3 (or a built-in text when absent).
// Usage: node make_synthetic.js OUT_DIR
'use strict';
const fs = require('fs');
const path = require('path');
const out = process.argv[2] || path.join(__dirname, 'synthetic');
fs.mkdirSync(out, { recursive: true });

let text = 'the quick brown fox jumps over the lazy dog. ';
try { text = fs.readFileSync('/usr/share/common-licenses/GPL-3', 'utf8'); } catch { text = text.repeat(200); }
text = text.slice(0, 40000);

function train(words, alphabet, nMerges) {
  // words: array of arrays of symbols. Returns merges [[a,b],...] and the vocab list.
  const vocab = [...alphabet];
  const have = new Set(vocab);
  const merges = [];
  let ws = words.map((w) => w.slice());
  for (let m = 0; m < nMerges; m++) {
    const counts = new Map();
    for (const w of ws) for (let i = 0; i + 1 < w.length; i++) {
      const k = w[i] + '\u0000' + w[i + 1];
      counts.set(k, (counts.get(k) || 0) + 1);
    }
    let best = null, bc = 0;
    for (const [k, c] of counts) if (c > bc || (c === bc && k < best)) { best = k; bc = c; }
    if (!best || bc < 2) break;
    const [a, b] = best.split('\u0000');
    merges.push([a, b]);
    if (!have.has(a + b)) { have.add(a + b); vocab.push(a + b); }
    ws = ws.map((w) => {
      const r = [];
      for (let i = 0; i < w.length; i++) {
        if (i + 1 < w.length && w[i] === a && w[i + 1] === b) { r.push(a + b); i++; } else r.push(w[i]);
      }
      return r;
    });
  }
  return { vocab, merges };
}

const ascii = [];
for (let c = 0x21; c < 0x7f; c++) ascii.push(String.fromCharCode(c));
const extra = ['é', 'ü', 'ß', '中', '文', '日', 'ж', 'и', 'я'];

// 1. SentencePiece-like (Llama 2 / Mistral style): byte fallback, Prepend + Replace normalizer, no
//    pre-tokenizer, Replace/ByteFallback/Fuse/Strip decoder, BOS template.
{
  const sp = '▁';
  const words = text.replace(/\s+/g, ' ').split(' ').filter(Boolean).map((w) => [...(sp + w)]);
  const alphabet = [sp, ...ascii, ...extra];
  const { vocab, merges } = train(words, alphabet, 600);
  const v = { '<unk>': 0, '<s>': 1, '</s>': 2 };
  for (let b = 0; b < 256; b++) v[`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`] = 3 + b;
  for (const t of vocab) if (!(t in v)) v[t] = Object.keys(v).length;
  const n = Object.keys(v).length;
  const tok = {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [
      { id: 0, content: '<unk>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      { id: 1, content: '<s>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      { id: 2, content: '</s>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      { id: n, content: '<tool>', single_word: false, lstrip: true, rstrip: true, normalized: false, special: false },
      { id: n + 1, content: '[MASK]', single_word: true, lstrip: false, rstrip: false, normalized: false, special: true },
      { id: n + 2, content: 'hello world', single_word: false, lstrip: false, rstrip: false, normalized: true, special: false },
    ],
    normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: sp }, { type: 'Replace', pattern: { String: ' ' }, content: sp }] },
    pre_tokenizer: null,
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<s>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } },
    },
    decoder: { type: 'Sequence', decoders: [
      { type: 'Replace', pattern: { String: sp }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' },
      { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab: v, merges: merges.map(([a, b]) => `${a} ${b}`) },
  };
  fs.writeFileSync(path.join(out, 'spm_like.json'), JSON.stringify(tok));
}

// 2. Metaspace pre-tokenizer + NFC + regex Replace, digits split, literal Split behaviours, unk without byte
//    fallback, merges as pairs with ignore_merges, Metaspace decoder, BOS/EOS template.
{
  const sp = '▁';
  const words = text.replace(/\s+/g, ' ').split(' ').filter(Boolean).map((w) => [...(sp + w)]);
  const alphabet = [sp, ...ascii, ...extra];
  const { vocab, merges } = train(words, alphabet, 500);
  const v = { '<unk>': 0, '<s>': 1, '</s>': 2 };
  for (const t of vocab) if (!(t in v)) v[t] = Object.keys(v).length;
  v[sp + 'GNU General Public License'] = Object.keys(v).length;  // only reachable through ignore_merges
  const n = Object.keys(v).length;
  const tok = {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [
      { id: 0, content: '<unk>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      { id: 1, content: '<s>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      { id: 2, content: '</s>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      { id: n, content: '<sep>', single_word: false, lstrip: true, rstrip: false, normalized: false, special: true },
    ],
    // NFC (not NFKC/Lowercase: utf8proc's Unicode 13 tables differ from HF's on newer characters).
    normalizer: { type: 'Sequence', normalizers: [{ type: 'NFC' }, { type: 'Replace', pattern: { Regex: '[\u2000-\u200a]+' }, content: ' ' }] },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Digits', individual_digits: true },
      { type: 'Metaspace', replacement: sp, prepend_scheme: 'first', split: true },
      { type: 'Split', pattern: { String: '-' }, behavior: 'MergedWithPrevious', invert: false },
      { type: 'Split', pattern: { Regex: '[,.;:]+' }, behavior: 'MergedWithNext', invert: false },
      { type: 'Split', pattern: { String: '/' }, behavior: 'Removed', invert: false },
      { type: 'Split', pattern: { Regex: '[()]' }, behavior: 'Contiguous', invert: false }] },
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
      pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] }, '</s>': { id: '</s>', ids: [2], tokens: ['</s>'] } },
    },
    decoder: { type: 'Metaspace', replacement: sp, prepend_scheme: 'first', split: true },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab: v, merges },
  };
  fs.writeFileSync(path.join(out, 'meta_like.json'), JSON.stringify(tok));
}
// 3. GPT-2 style: ByteLevel pre-tokenizer with its own regex and add_prefix_space, ByteLevel decoder.
{
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const map = new Array(256);
  let nxt = 256;
  for (let b = 0; b < 256; b++) map[b] = bs.includes(b) ? String.fromCodePoint(b) : String.fromCodePoint(nxt++);
  const enc = (w) => [...Buffer.from(w, 'utf8')].map((b) => map[b]);
  const words = (' ' + text).match(/ ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+/gu).map(enc);
  const { vocab, merges } = train(words, map, 500);
  const v = {};
  for (const t of vocab) if (!(t in v)) v[t] = Object.keys(v).length;
  const n = Object.keys(v).length;
  const tok = {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [{ id: n, content: '<|endoftext|>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
             fuse_unk: false, byte_fallback: false, vocab: v, merges: merges.map(([a, b]) => `${a} ${b}`) },
  };
  fs.writeFileSync(path.join(out, 'gpt2_like.json'), JSON.stringify(tok));
}
console.log(`wrote ${out}/spm_like.json, ${out}/meta_like.json, ${out}/gpt2_like.json`);
