// Deterministic PRNG (mulberry32) shared by the corpus builder and the reference generator, so both scripts
// draw the same kind of stream from a seed. rng(seed)() → float in [0, 1).
'use strict';

function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

module.exports = { rng };
