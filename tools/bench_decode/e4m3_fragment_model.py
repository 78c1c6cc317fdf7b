#!/usr/bin/env python3
# Model of the e4m3 fragment mappings of backend/cuda/paged_decode_tc.cu and backend/cuda/msa_decode_index.cu (issue 15
# item 4), pure Python: ldmatrix (plain / .trans) and mma.sync m16n8k16 fragments as the PTX ISA defines them, the
# swizzles, byte permutes and the exact e4m3 -> bf16 conversion of backend/cuda/kv_fp8.cuh. It checks one warp's S = Q.K^T,
# O = P.V (with the epilogue's dim order) and the scorer's keys x heads against plain matrix products, and that the same
# model reproduces the bf16 kernel's (device-tested) mapping. Run: python3 tools/bench_decode/e4m3_fragment_model.py
import struct, random
random.seed(1)
class _NP:
    nan = float('nan')
    def zeros(self, shape): return Mat([[0.0]*shape[1] for _ in range(shape[0])])
    def full(self, shape, v): return Mat([[v]*shape[1] for _ in range(shape[0])])
    def array(self, rows): return Mat([list(r) for r in rows])
    def vectorize(self, f): return lambda M: Mat([[f(x) for x in r] for r in M.r])
class Mat:
    def __init__(s, r): s.r = r
    def __getitem__(s, k):
        if isinstance(k, tuple):
            i, j = k
            if isinstance(j, slice):
                return s.r[i][j]
            return s.r[i][j]
        if isinstance(k, slice): return Mat(s.r[k])
        return s.r[k]
    def __setitem__(s, k, v):
        i, j = k
        if isinstance(i, slice):
            for a, b in zip(range(*i.indices(len(s.r))), v): s.r[a][j] = b
            return
        if isinstance(j, slice):
            idx = range(*j.indices(len(s.r[i])))
            for a, b in zip(idx, v): s.r[i][a] = b
        else: s.r[i][j] = v
    @property
    def T(s): return Mat([list(x) for x in zip(*s.r)])
    def __matmul__(s, o):
        oT = list(zip(*o.r))
        return Mat([[sum(a*b for a, b in zip(row, col)) for col in oT] for row in s.r])
np = _NP()
class _RNG:
    def choice(self, codes, size): return Mat([[random.choice(codes) for _ in range(size[1])] for _ in range(size[0])])
    def integers(self, a, b): return random.randrange(a, b)
rng = _RNG()

def e4m3_val(c):
    s = -1.0 if c & 0x80 else 1.0
    e = (c >> 3) & 0xF; m = c & 7
    if e == 0: return s * m / 8 * 2**-6
    return s * (1 + m/8) * 2**(e-7)
def bf16_to_f(b):
    return struct.unpack('<f', struct.pack('<I', (b & 0xFFFF) << 16))[0]
def byte_perm(x, y, sel):
    src = [(x >> (8*i)) & 0xFF for i in range(4)] + [(y >> (8*i)) & 0xFF for i in range(4)]
    r = 0
    for i in range(4):
        r |= src[(sel >> (4*i)) & 7] << (8*i)
    return r
def placed_to_pair(v):
    b = (((v >> 4) & 0x07F007F0) | (v & 0x80008000)) & 0xFFFFFFFF
    return (bf16_to_f(b & 0xFFFF) * 2.0**120, bf16_to_f(b >> 16) * 2.0**120)
def cvt(w, sel): return placed_to_pair(byte_perm(w, 0, sel))
B01, B23, B02, B13 = 0x1404, 0x3424, 0x2404, 0x3414

# exhaustive conversion check
for c in range(256):
    if (c & 0x7f) == 0x7f: continue
    w = c | (c << 8) | (c << 16) | (c << 24)
    for sel in (B01, B23, B02, B13):
        a, b = cvt(w, sel)
        assert a == e4m3_val(c) and b == e4m3_val(c), (c, sel, a, b)
print("conversion exact for all finite codes")

def swz64(row, chunk): return row * 128 + ((chunk ^ (row & 7)) << 4)
def swz128(row, chunk): return row * 256 + ((chunk ^ (row & 7)) << 4)

class Smem:
    def __init__(s, n): s.b = bytearray(n)
    def u32(s, addr): return struct.unpack_from('<I', s.b, addr)[0]
    def ldmatrix_x4(s, addrs, trans=False):
        # addrs[lane] = row address; returns regs[lane][4]
        regs = [[0]*4 for _ in range(32)]
        for i in range(4):
            rows = [addrs[8*i + r] for r in range(8)]
            mat = [[struct.unpack_from('<H', s.b, rows[r] + 2*col)[0] for col in range(8)] for r in range(8)]
            for t in range(32):
                g, c = t // 4, t % 4
                if not trans: lo, hi = mat[g][2*c], mat[g][2*c+1]
                else: lo, hi = mat[2*c][g], mat[2*c+1][g]
                regs[t][i] = lo | (hi << 16)
        return regs

def bf16_bits(x):  # x exactly representable
    return struct.unpack('<I', struct.pack('<f', x))[0] >> 16
def pair(u): return (bf16_to_f(u & 0xFFFF), bf16_to_f(u >> 16))

def mma(C, A, Bf):
    # C[t][4] += A (regs per lane, 4 u32 bf16x2) x B (per lane 2 values-pairs as floats)
    Am = np.zeros((16, 16)); Bm = np.zeros((16, 8))
    for t in range(32):
        g, c = t // 4, t % 4
        a = [pair(A[t][i]) if isinstance(A[t][i], int) else A[t][i] for i in range(4)]
        Am[g, 2*c:2*c+2] = a[0]; Am[g+8, 2*c:2*c+2] = a[1]; Am[g, 2*c+8:2*c+10] = a[2]; Am[g+8, 2*c+8:2*c+10] = a[3]
        b0, b1 = Bf[t]
        Bm[2*c:2*c+2, g] = b0; Bm[2*c+8:2*c+10, g] = b1
    D = Am @ Bm
    for t in range(32):
        g, c = t // 4, t % 4
        C[t][0] += D[g, 2*c]; C[t][1] += D[g, 2*c+1]; C[t][2] += D[g+8, 2*c]; C[t][3] += D[g+8, 2*c+1]

# ---- attention, one warp (warp = 1 of 4), one chunk of 64 tokens -------------------------------------------
warp = 1
codes = [c for c in range(256) if (c & 0x7f) != 0x7f]
Kc = rng.choice(codes, size=(64, 128)); Vc = rng.choice(codes, size=(64, 128))
Kv = np.vectorize(e4m3_val)(Kc); Vv = np.vectorize(e4m3_val)(Vc)
Q = np.array([[rng.integers(-8, 8) / 8 for _ in range(128)] for _ in range(16)])
sm = Smem(8192 * 2 + 16 * 256)
ks, vs, qo = 0, 8192, 16384
for row in range(64):
    for ch in range(8):
        for i in range(16):
            sm.b[ks + swz64(row, ch) + i] = int(Kc[row, ch*16 + i]); sm.b[vs + swz64(row, ch) + i] = int(Vc[row, ch*16 + i])
for row in range(16):
    for ch in range(16):
        for i in range(8):
            struct.pack_into('<H', sm.b, qo + swz128(row, ch) + 2*i, bf16_bits(Q[row, ch*8 + i]))
# Q fragments (kFp8 path)
qf = [[None]*4 for _ in range(32)]
qf = {kk: [[0]*4 for _ in range(32)] for kk in range(8)}
for t in range(32):
    g, c = t >> 2, t & 3
    for kk in range(8):
        inc = (c & 1) * 8
        q0 = qo + swz128(g, 2*kk + (c >> 1)) + inc; q1 = qo + swz128(g + 8, 2*kk + (c >> 1)) + inc
        qf[kk][t] = [sm.u32(q0), sm.u32(q1), sm.u32(q0 + 4), sm.u32(q1 + 4)]
sc = [[[0.0]*4 for _ in range(32)] for _ in range(2)]
for j in range(2):
    for h in range(2):
        w = sm.ldmatrix_x4([ks + swz64(warp*16 + 8*j + (l & 7), 4*h + (l >> 3)) for l in range(32)])
        for m in range(4):
            mma(sc[j], qf[4*h + m], [(cvt(w[t][m], B01), cvt(w[t][m], B23)) for t in range(32)])
Sref = Q @ Kv[warp*16:warp*16+16].T  # [16 rows, 16 tokens]
for j in range(2):
    for t in range(32):
        g, c = t >> 2, t & 3
        for e in range(4):
            row = g + (8 if e >= 2 else 0); tok = j*8 + 2*c + (e & 1)
            assert abs(sc[j][t][e] - Sref[row, tok]) < 1e-9 * max(1, abs(Sref[row, tok])), ("S", j, t, e)
print("attention S mapping ok")
# P = S (as exact small values: use random P in the S fragment layout)
P = np.array([[rng.integers(0, 8) / 8 for _ in range(16)] for _ in range(16)])
pa = []
for t in range(32):
    g, c = t >> 2, t & 3
    pa.append([(P[g, 2*c], P[g, 2*c+1]), (P[g+8, 2*c], P[g+8, 2*c+1]), (P[g, 8+2*c], P[g, 9+2*c]), (P[g+8, 8+2*c], P[g+8, 9+2*c])])
o = [[[0.0]*4 for _ in range(32)] for _ in range(16)]
for i in range(4):
    w = sm.ldmatrix_x4([vs + swz64(warp*16 + ((l >> 3) & 1)*8 + (l & 7), 2*i + (l >> 4)) for l in range(32)], trans=True)
    for q in range(2):
        ch = 2*i + q
        mma(o[2*ch], pa, [(cvt(w[t][2*q], B02), cvt(w[t][2*q+1], B02)) for t in range(32)])
        mma(o[2*ch+1], pa, [(cvt(w[t][2*q], B13), cvt(w[t][2*q+1], B13)) for t in range(32)])
Oref = P @ Vv[warp*16:warp*16+16]
ow = np.full((16, 128), np.nan)
for t in range(32):
    g, c = t >> 2, t & 3
    for ch in range(8):
        d = ch*16 + 4*c
        ow[g, d:d+4] = [o[2*ch][t][0], o[2*ch+1][t][0], o[2*ch][t][1], o[2*ch+1][t][1]]
        ow[g+8, d:d+4] = [o[2*ch][t][2], o[2*ch+1][t][2], o[2*ch][t][3], o[2*ch+1][t][3]]
for r_ in range(16):
    for d_ in range(128):
        assert abs(ow[r_, d_] - Oref[r_, d_]) < 1e-9, (r_, d_, ow[r_, d_], Oref[r_, d_])
print("attention P.V mapping + epilogue ok")

# ---- scorer, one warp, one page [128 keys, 128 dims] -----------------------------------------------------------
warp = 5; H = 4
Ic = rng.choice(codes, size=(128, 128)); Iv = np.vectorize(e4m3_val)(Ic)
IQ = np.array([[rng.integers(-8, 8) / 8 for _ in range(128)] for _ in range(H)])
sm2 = Smem(16384)
for row in range(128):
    for ch in range(8):
        for i in range(16):
            sm2.b[swz64(row, ch) + i] = int(Ic[row, ch*16 + i])
qb = {}
for t in range(32):
    n, c = t >> 2, t & 3
    for kk in range(8):
        if n < H:
            b0 = (IQ[n, 16*kk + 4*c], IQ[n, 16*kk + 4*c + 1]); b1 = (IQ[n, 16*kk + 4*c + 2], IQ[n, 16*kk + 4*c + 3])
        else: b0 = b1 = (0.0, 0.0)
        qb[(kk, t)] = (b0, b1)
cacc = [[0.0]*4 for _ in range(32)]
for h in range(4):
    w = sm2.ldmatrix_x4([swz64(warp*16 + (l & 7) + ((l >> 3) & 1)*8, 2*h + (l >> 4)) for l in range(32)])
    for q in range(2):
        A = [[cvt(w[t][2*q], B01), cvt(w[t][2*q+1], B01), cvt(w[t][2*q], B23), cvt(w[t][2*q+1], B23)] for t in range(32)]
        mma(cacc, A, [qb[(2*h + q, t)] for t in range(32)])
Sref = Iv[warp*16:warp*16+16] @ IQ.T  # [16 keys, H]
for t in range(32):
    g, c = t >> 2, t & 3
    for e in range(4):
        key = g + (8 if e >= 2 else 0); head = 2*c + (e & 1)
        want = Sref[key, head] if head < H else 0.0
        assert abs(cacc[t][e] - want) < 1e-9, ("scorer", t, e, cacc[t][e], want)
print("scorer mapping ok")

# ---- model check: the working bf16 kernel's mapping under the same model ----------------------------------------
Kb = Mat([[random.randrange(-8, 8) / 8 for _ in range(128)] for _ in range(64)])
Vb = Mat([[random.randrange(-8, 8) / 8 for _ in range(128)] for _ in range(64)])
sm3 = Smem(2 * 16384 + 4096)
kb, vb, qo3 = 0, 16384, 32768
for row in range(64):
    for ch in range(16):
        for i in range(8):
            struct.pack_into('<H', sm3.b, kb + swz128(row, ch) + 2*i, bf16_bits(Kb[row, ch*8+i]))
            struct.pack_into('<H', sm3.b, vb + swz128(row, ch) + 2*i, bf16_bits(Vb[row, ch*8+i]))
for row in range(16):
    for ch in range(16):
        for i in range(8):
            struct.pack_into('<H', sm3.b, qo3 + swz128(row, ch) + 2*i, bf16_bits(Q[row, ch*8 + i]))
qf3 = {}
for kk in range(8):
    r = sm3.ldmatrix_x4([qo3 + swz128((l & 7) + ((l >> 3) & 1) * 8, 2*kk + (l >> 4)) for l in range(32)])
    qf3[kk] = r
sc3 = [[[0.0]*4 for _ in range(32)] for _ in range(2)]
for kk in range(8):
    r = sm3.ldmatrix_x4([kb + swz128(1*16 + ((l >> 4) << 3) + (l & 7), 2*kk + ((l >> 3) & 1)) for l in range(32)])
    mma(sc3[0], qf3[kk], [(pair(r[t][0]), pair(r[t][1])) for t in range(32)])
    mma(sc3[1], qf3[kk], [(pair(r[t][2]), pair(r[t][3])) for t in range(32)])
Sref3 = Q @ Mat(Kb.r[16:32]).T
for j in range(2):
    for t in range(32):
        g, c = t >> 2, t & 3
        for e in range(4):
            row = g + (8 if e >= 2 else 0); tok = j*8 + 2*c + (e & 1)
            assert abs(sc3[j][t][e] - Sref3[row, tok]) < 1e-9, ("bf16 S", j, t, e)
o3 = [[[0.0]*4 for _ in range(32)] for _ in range(16)]
for nd in range(8):
    r = sm3.ldmatrix_x4([vb + swz128(1*16 + ((l >> 3) & 1) * 8 + (l & 7), 2*nd + (l >> 4)) for l in range(32)], trans=True)
    mma(o3[2*nd], pa, [(pair(r[t][0]), pair(r[t][1])) for t in range(32)])
    mma(o3[2*nd+1], pa, [(pair(r[t][2]), pair(r[t][3])) for t in range(32)])
Oref3 = P @ Mat(Vb.r[16:32])
for t in range(32):
    g, c = t >> 2, t & 3
    for n in range(16):
        d = n*8 + 2*c
        for e in range(4):
            row = g + (8 if e >= 2 else 0)
            assert abs(o3[n][t][e] - Oref3[row, d + (e & 1)]) < 1e-9, ("bf16 O", n, t, e)
print("model reproduces the bf16 kernel's mapping")
