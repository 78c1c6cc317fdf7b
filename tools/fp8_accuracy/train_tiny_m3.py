#!/usr/bin/env python3
"""Train a tiny MiniMax-M3 (the tiny_sparse shape) on real text, for the FP8 accuracy measurement of issue 15 item 5.

Random weights amplify quantisation (docs/FP8.md section 3): the FP8 paths' cost in top-1 agreement and perplexity has
to be measured on a model that predicts something. This trains the tiny_sparse config (tests/golden/configs) as a
byte-level language model (ids 0-255 of its 1,024) on English text, then writes the trained weights as two released-
layout checkpoints through tools/checkpoint/make_checkpoint.py: bf16 and MXFP8 (per-32 UE8M0, the release format).
`fp8_accuracy --eval-text` then compares the FP8 paths against the bf16 model on held-out text.

The forward here is the CPU reference's (src/model/m3_model.cpp) in PyTorch: Gemma RMSNorm (1 + w), per-head q/k norm,
partial NeoX RoPE, GQA causal attention, SwiGLU-OAI, sigmoid routing with the correction bias (selection only) and
renormalised top-k weights times the routed scale, a shared expert. The MSA layers run dense: the config's blocks are
made large enough (block 64 x top-4 = 256 tokens) that every block is selected for sequences of <= 256 tokens, so
MSA equals dense causal attention and the (untrained) index branch selects nothing. `fp8_accuracy` checks that the
CPU model reproduces this model's loss on the same text.

Trained index branch (the FP8 index-K measurement, docs/FP8.md section 3.1): --sparse runs the MSA layers as the CPU
reference does (src/model/m3_model.cpp, backend/cpu/msa_indexer.cpp): index q/k = xn . W_index_q/k, Gemma norm per head,
the same partial NeoX RoPE, block score = max over a history block's keys of iq . ik per index head, the local block
forced plus the top-(K-1) history blocks (all blocks while <= K are visible), index head h selecting for KV head h.
The index branch learns by distillation: KL(target || softmax over history blocks of score / sqrt(Di)), the target
being the dense attention's probability mass per history block averaged over the query heads of the KV head
(detached). --init DIR starts from a checkpoint (e.g. the dense-trained one); --index-steps N first trains only the
index branch that way (dense LM frozen), then --steps LM steps with sparse attention train everything on
cross-entropy + --index-kl x KL. --block / --topk set the MSA block size and top-k written to the checkpoints.
  train_tiny_m3.py --train ... --out DIR --init OLD/bf16 --sparse --block 16 --topk 4 --seq 256 --batch 4 \
      --index-steps 400 --index-lr 3e-3 --steps 600 --lr 1e-3 --index-kl 1 --eval FILE... --eval-seqs 128
(bench/results/2026-12-03e-fp8-index-trained-cpu.md: KL 1.20 -> 0.08 nats, MSA perplexity within 0.1 % of dense.)
--eval then reports the bf16-rounded model with MSA and, for comparison, with dense attention.

Needs Debian's python3-torch (apt-get install python3-torch python3-numpy); CPU only.
  train_tiny_m3.py --train FILE... --out DIR [--steps 3000] [--seq 256] [--batch 16] [--seed 0] [--eval FILE...]
writes DIR/bf16/, DIR/mxfp8/ (checkpoints) and DIR/train.log. --eval: bits per byte of the trained model with its
weights rounded to bf16, on FILE cut as fp8_eval_text cuts it (its first "bf16; fp32" row must agree).
"""

import argparse
import copy
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "checkpoint"))
import make_checkpoint as mc  # noqa: E402


def tiny_config(block=64, topk=4):
    with open(os.path.join(ROOT, "tests", "golden", "configs", "tiny_sparse.json")) as f:
        cfg = json.load(f)
    cfg = copy.deepcopy(cfg)
    sc = cfg["text_config"]["sparse_attention_config"]
    sc["sparse_block_size"], sc["sparse_topk_blocks"] = block, topk  # default 64 x 4 = 256 tokens: every block (dense)
    cfg.pop("vision_config", None)
    return cfg


class TinyM3(torch.nn.Module):
    def __init__(self, tc, specs, seed):
        super().__init__()
        self.tc = tc
        g = torch.Generator().manual_seed(seed)
        self.p = torch.nn.ParameterDict()
        for s in specs:
            std = mc._std(s)
            if s.kind in ("norm", "bias"):
                t = torch.zeros(s.shape)  # Gemma norms start at 1 + 0; the correction bias at 0 (not trained)
            elif s.kind == "gateup":
                t = torch.randn(s.shape, generator=g) / math.sqrt(s.shape[-1])
            else:
                t = torch.randn(s.shape, generator=g) * std
            self.p[self.key(s.name)] = torch.nn.Parameter(t, requires_grad=s.kind != "bias")
        L = tc["num_hidden_layers"]
        sc = tc["sparse_attention_config"]
        self.sparse = sc["sparse_attention_freq"] if sc.get("use_sparse_attention", True) else [0] * L
        self.moe = tc["moe_layer_freq"]
        half = tc["rotary_dim"] // 2
        self.inv_freq = torch.tensor(
            [1.0 / (float(tc["rope_theta"]) ** (2.0 * i / tc["rotary_dim"])) for i in range(half)], dtype=torch.float32)
        self.msa = False  # True: MSA layers attend over the index branch's selection (else dense causal)
        self.balance = True  # False: leave the routers' correction biases alone (frozen LM)
        self.index_kl = False  # True: collect the index branch's distillation loss in self.kl (one per MSA layer)
        self.kl = []

    @staticmethod
    def key(name):
        return name.replace(".", "/")

    def w(self, name):
        return self.p[self.key("language_model.model." + name)]

    def norm(self, x, w):
        eps = self.tc["rms_norm_eps"]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)

    def rope(self, x, pos):  # x [B, T, heads, D]; partial NeoX: dims i and i + half of the first rotary_dim
        half = self.inv_freq.numel()
        a = pos[:, None].float() * self.inv_freq[None, :]  # [T, half]
        c, s = torch.cos(a)[None, :, None, :], torch.sin(a)[None, :, None, :]
        x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)

    def swiglu(self, g, u):
        a, lim = self.tc["swiglu_alpha"], self.tc["swiglu_limit"]
        g = torch.clamp(g, max=lim)
        u = torch.clamp(u, min=-lim, max=lim)
        return g * torch.sigmoid(a * g) * (u + 1.0)

    def mlp(self, x, gate, up, down):
        return self.swiglu(x @ gate.t(), x @ up.t()) @ down.t()

    def index_scores(self, xn, p, pos):
        """[B, Hi, T, nb] block scores (max over each history block's keys of iq . ik; -inf for the local block and
        later ones) and the [T, nb] history mask, as backend/cpu/msa_indexer.cpp computes them."""
        sc = self.tc["sparse_attention_config"]
        Hi, Di, Bs = sc["sparse_num_index_heads"], sc["sparse_index_dim"], sc["sparse_block_size"]
        B, T, _ = xn.shape
        iq = (xn @ self.w(p + "self_attn.index_q_proj.weight").t()).view(B, T, Hi, Di)
        ik = (xn @ self.w(p + "self_attn.index_k_proj.weight").t()).view(B, T, 1, Di)
        iq = self.rope(self.norm(iq, self.w(p + "self_attn.index_q_norm.weight")), pos)
        ik = self.rope(self.norm(ik, self.w(p + "self_attn.index_k_norm.weight")), pos)
        nb = (T + Bs - 1) // Bs
        s = torch.einsum("bthd,bjd->bhtj", iq, ik[:, :, 0])
        s = torch.nn.functional.pad(s, (0, nb * Bs - T), value=float("-inf")).view(B, Hi, T, nb, Bs).amax(-1)
        hist = torch.arange(nb)[None, :] < (pos // Bs)[:, None]  # [T, nb]: blocks entirely in the past
        return s.masked_fill(~hist, float("-inf")), hist

    def select(self, s, hist, pos):
        """[B, Hi, T, nb] selected blocks: the local one and the top-(K-1) history blocks (all when fewer)."""
        sc = self.tc["sparse_attention_config"]
        Bs, K = sc["sparse_block_size"], sc["sparse_topk_blocks"]
        nb = s.shape[-1]
        top = torch.topk(s.detach(), min(K - 1, nb), dim=-1).indices
        sel = torch.zeros(s.shape, dtype=torch.bool).scatter(-1, top, True) & hist
        return sel | (torch.arange(nb)[None, :] == (pos // Bs)[:, None])

    def block_kl(self, s, hist, probs, pos):
        """KL(target || softmax(s / sqrt(Di)) over history blocks), target = attention mass per history block
        (probs [B, Hq, T, T], detached), averaged over each KV head's query heads, renormalised over the history."""
        sc = self.tc["sparse_attention_config"]
        Bs, Di, Hi = sc["sparse_block_size"], sc["sparse_index_dim"], sc["sparse_num_index_heads"]
        B, Hq, T, _ = probs.shape
        nb = s.shape[-1]
        m = torch.nn.functional.pad(probs.detach(), (0, nb * Bs - T)).view(B, Hq, T, nb, Bs).sum(-1)
        m = m.view(B, Hi, Hq // Hi, T, nb).mean(2).masked_fill(~hist, 0.0)
        tgt = m / m.sum(-1, keepdim=True).clamp_min(1e-20)
        logq = torch.log_softmax(s / math.sqrt(Di), dim=-1)
        kl = torch.where(hist, tgt * (torch.log(tgt.clamp_min(1e-20)) - logq), torch.zeros_like(tgt)).sum(-1)
        rows = (pos // Bs) >= 2  # at least two history blocks to rank
        return kl[..., rows].mean()

    def forward(self, ids, stop_after=None):
        tc = self.tc
        self.kl = []
        B, T = ids.shape
        H, nq, nkv, hd = tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
        pos = torch.arange(T)
        x = self.w("embed_tokens.weight")[ids]
        mask = torch.full((T, T), float("-inf")).triu(1)
        for l in range(tc["num_hidden_layers"]):
            p = f"layers.{l}."
            xn = self.norm(x, self.w(p + "input_layernorm.weight"))
            q = (xn @ self.w(p + "self_attn.q_proj.weight").t()).view(B, T, nq, hd)
            k = (xn @ self.w(p + "self_attn.k_proj.weight").t()).view(B, T, nkv, hd)
            v = (xn @ self.w(p + "self_attn.v_proj.weight").t()).view(B, T, nkv, hd)
            q = self.rope(self.norm(q, self.w(p + "self_attn.q_norm.weight")), pos)
            k = self.rope(self.norm(k, self.w(p + "self_attn.k_norm.weight")), pos)
            rep = nq // nkv
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
            att = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd) + mask
            probs = torch.softmax(att, -1)
            if self.sparse[l] and (self.msa or self.index_kl):
                s, hist = self.index_scores(xn, p, pos)
                if self.index_kl:
                    self.kl.append(self.block_kl(s, hist, probs, pos))
                if self.msa:  # attend over the selected blocks' keys (causal in the local block)
                    sel = self.select(s, hist, pos)  # [B, Hi, T, nb]
                    Bs = tc["sparse_attention_config"]["sparse_block_size"]
                    keys = sel[..., torch.arange(T) // Bs].repeat_interleave(rep, dim=1)  # [B, Hq, T, T]
                    probs = torch.softmax(att.masked_fill(~keys, float("-inf")), -1)
            if stop_after is not None and l == stop_after:
                return None
            o = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, T, nq * hd)
            x = x + o @ self.w(p + "self_attn.o_proj.weight").t()
            xn = self.norm(x, self.w(p + "post_attention_layernorm.weight"))
            if not self.moe[l]:
                x = x + self.mlp(xn, self.w(p + "mlp.gate_proj.weight"), self.w(p + "mlp.up_proj.weight"),
                                 self.w(p + "mlp.down_proj.weight"))
                continue
            b = p + "block_sparse_moe."
            E, K = tc["num_local_experts"], tc["num_experts_per_tok"]
            s = torch.sigmoid(xn @ self.w(b + "gate.weight").t())  # [B, T, E]
            top = torch.topk(s.detach() + self.w(b + "e_score_correction_bias"), K, dim=-1).indices
            ws = torch.gather(s, -1, top)
            ws = ws / ws.sum(-1, keepdim=True) * tc["routed_scaling_factor"]
            dense_w = torch.zeros_like(s).scatter(-1, top, ws)  # [B, T, E]: 0 for the experts not chosen
            y = 0
            for e in range(E):
                ye = self.mlp(xn, self.w(f"{b}experts.{e}.w1.weight"), self.w(f"{b}experts.{e}.w3.weight"),
                              self.w(f"{b}experts.{e}.w2.weight"))
                y = y + dense_w[..., e:e + 1] * ye
            y = y + self.mlp(xn, self.w(b + "shared_experts.gate_proj.weight"),
                             self.w(b + "shared_experts.up_proj.weight"), self.w(b + "shared_experts.down_proj.weight"))
            x = x + y
            if not self.balance:
                continue
            with torch.no_grad():  # aux-loss-free balancing: nudge the correction bias toward equal load
                load = torch.zeros(E).scatter_add(0, top.reshape(-1), torch.ones(top.numel()))
                bias = self.w(b + "e_score_correction_bias")
                bias += 1e-3 * torch.sign(load.mean() - load)
        x = self.norm(x, self.w("norm.weight"))
        return x @ self.p[self.key("language_model.lm_head.weight")].t()


def read_bytes(paths):
    data = b""
    for p in paths:
        with open(p, "rb") as f:
            data += f.read() + b"\n\n"
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


def load_init(model, specs, d):
    """Weights of a checkpoint written by this script (bf16 / f32 tensors; not MXFP8) into the model."""
    got, _ = mc.read_safetensors(os.path.join(d, "model.safetensors"))
    with torch.no_grad():
        for sp in specs:
            dt, a = got[sp.name]
            a = mc.bf16_bits_to_f32(a) if dt == "BF16" else a.astype(np.float32)
            model.p[TinyM3.key(sp.name)].copy_(torch.from_numpy(np.array(a).reshape(sp.shape)))


def is_index(name):
    return "self_attn.index_" in name


def evaluate(model, specs, tc, path, seq, max_seqs, log):
    with torch.no_grad():
        ev_model = copy.deepcopy(model)  # the bf16 checkpoint's values: everything but the router and its bias
        ev_model.index_kl = False
        ev_model.balance = False
        for sp in specs:
            if sp.kind not in ("router", "bias"):
                prm = ev_model.p[TinyM3.key(sp.name)]
                prm.copy_(prm.to(torch.bfloat16).to(torch.float32))
        ev = read_bytes([path])[:-2]  # read_bytes appends two newlines
        n = min(max_seqs, len(ev) // seq)
        seqs = torch.from_numpy(ev[:n * seq].reshape(n, seq))
        modes = [True, False] if model.msa else [False]
        for msa in modes:  # MSA as trained, then (for comparison) the same weights with dense attention
            ev_model.msa = msa
            nll = 0.0
            for i in range(0, n, 8):  # chunks of 8 sequences bound the memory at long sequences
                lg = ev_model(seqs[i:i + 8])[:, :-1]
                nll += torch.nn.functional.cross_entropy(lg.reshape(-1, tc["vocab_size"]), seqs[i:i + 8, 1:].reshape(-1),
                                                         reduction="sum").item()
            nll /= n * (seq - 1)
            msg = f"eval {path}: {n} x {seq} bytes, bf16-rounded weights, {'MSA' if msa else 'dense'} attention: " \
                  f"perplexity {math.exp(nll):.4f}, {nll / math.log(2):.4f} bits/byte"
            print(msg, flush=True)
            log.write(msg + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval", nargs="*", default=[],
                    help="held-out text: bits per byte of the bf16-rounded model (fp8_eval_text's cut)")
    ap.add_argument("--eval-seqs", type=int, default=64)
    ap.add_argument("--block", type=int, default=64, help="MSA block size (config sparse_block_size)")
    ap.add_argument("--topk", type=int, default=4, help="MSA blocks per (token, KV head), local included")
    ap.add_argument("--sparse", action="store_true",
                    help="MSA layers attend over the index branch's selection (default: dense causal)")
    ap.add_argument("--init", help="start from this checkpoint directory (bf16 or f32, written by this script)")
    ap.add_argument("--index-steps", type=int, default=0,
                    help="first train only the index branch for this many steps (KL to the dense attention mass)")
    ap.add_argument("--index-lr", type=float, default=3e-3)
    ap.add_argument("--index-kl", type=float, default=0.0,
                    help="weight of the index distillation loss during the --steps LM steps (needs --sparse)")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cfg = tiny_config(args.block, args.topk)
    tc = cfg["text_config"]
    specs = mc.text_tensor_specs(tc)
    model = TinyM3(tc, specs, args.seed)
    if args.init:
        load_init(model, specs, args.init)
    data = torch.from_numpy(read_bytes(args.train))
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "train.log"), "w")
    log.write(" ".join(sys.argv) + "\n")
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    last_sparse = max([l for l, f in enumerate(model.sparse) if f], default=None)

    def batch_of():
        starts = rng.integers(0, len(data) - args.seq - 1, size=args.batch)
        return torch.stack([data[s:s + args.seq + 1] for s in starts])

    # Phase 1: the index branch alone, distilled from the (frozen) dense model's attention.
    if args.index_steps:
        index_params = [prm for name, prm in model.p.items() if is_index(name.replace("/", "."))]
        opt = torch.optim.AdamW(index_params, lr=args.index_lr, weight_decay=0.0, betas=(0.9, 0.95))
        saved = {name: prm.requires_grad for name, prm in model.p.items()}
        for name, prm in model.p.items():
            prm.requires_grad_(is_index(name.replace("/", ".")))
        model.msa, model.index_kl, model.balance = False, True, False
        for step in range(args.index_steps):
            lr = args.index_lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / args.index_steps))
            for gr in opt.param_groups:
                gr["lr"] = lr
            model(batch_of()[:, :-1], stop_after=last_sparse)
            loss = sum(model.kl) / len(model.kl)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(index_params, 1.0)
            opt.step()
            if step % 50 == 0 or step == args.index_steps - 1:
                msg = f"index step {step} KL {loss.item():.4f} ({', '.join(f'{k.item():.4f}' for k in model.kl)}) " \
                      f"lr {lr:.2e} {time.time() - t0:.0f} s"
                print(msg, flush=True)
                log.write(msg + "\n")
        for name, prm in model.p.items():
            prm.requires_grad_(saved[name])

    # Phase 2: language modelling (dense, or over the MSA selection with the index distillation beside it).
    model.msa, model.index_kl, model.balance = args.sparse, args.sparse and args.index_kl > 0, True
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.01,
                            betas=(0.9, 0.95))
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for gr in opt.param_groups:
            gr["lr"] = lr
        batch = batch_of()
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        kl = sum(model.kl) / len(model.kl) if model.kl else torch.zeros(())
        opt.zero_grad()
        (loss + args.index_kl * kl).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            msg = f"step {step} loss {loss.item():.4f} ({loss.item() / math.log(2):.3f} bits/byte) lr {lr:.2e} " \
                  + (f"index KL {kl.item():.4f} " if model.kl else "") + f"{time.time() - t0:.0f} s"
            print(msg, flush=True)
            log.write(msg + "\n")
    model.index_kl, model.kl = False, []  # (deepcopy refuses the graph's tensors)

    for path in args.eval:
        evaluate(model, specs, tc, path, args.seq, args.eval_seqs, log)
    log.close()
    trained = {s.name: model.p[TinyM3.key(s.name)].detach().numpy().astype(np.float32) for s in specs}
    mc.generate_chunks = lambda spec, seed: iter([(0, trained[spec.name])])  # the writer draws from these
    for dtype in ("bf16", "mxfp8"):
        c = copy.deepcopy(cfg)
        c["torch_dtype"] = "bfloat16"
        if dtype == "mxfp8":
            c["quantization_config"] = {"quant_method": "mxfp8", "activation_scheme": "dynamic",
                                        "weight_block_size": [1, 32], "ignored_layers": mc.quant_ignored_layers(c)}
        d = os.path.join(args.out, dtype)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
            f.write("\n")
        outs = mc.build_out_tensors(specs, dtype, args.seed, "bf16")
        mc.write_safetensors(os.path.join(d, "model.safetensors"), outs,
                             {"format": "pt", "generator": "tools/fp8_accuracy/train_tiny_m3.py", "dtype": dtype})
        print(f"wrote {d}")


if __name__ == "__main__":
    main()
