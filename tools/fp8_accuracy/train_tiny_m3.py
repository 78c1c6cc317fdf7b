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

Needs Debian's python3-torch (apt-get install python3-torch python3-numpy); CPU only.
  train_tiny_m3.py --train FILE... --out DIR [--steps 3000] [--seq 256] [--batch 16] [--seed 0] [--eval FILE]
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


def tiny_config():
    with open(os.path.join(ROOT, "tests", "golden", "configs", "tiny_sparse.json")) as f:
        cfg = json.load(f)
    cfg = copy.deepcopy(cfg)
    sc = cfg["text_config"]["sparse_attention_config"]
    sc["sparse_block_size"], sc["sparse_topk_blocks"] = 64, 4  # 256 tokens: every block selected (dense)
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

    def forward(self, ids):
        tc = self.tc
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
            o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(att, -1), v).reshape(B, T, nq * hd)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval", help="held-out text: bits per byte of the bf16-rounded model (fp8_eval_text's cut)")
    ap.add_argument("--eval-seqs", type=int, default=64)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cfg = tiny_config()
    tc = cfg["text_config"]
    specs = mc.text_tensor_specs(tc)
    model = TinyM3(tc, specs, args.seed)
    data = torch.from_numpy(read_bytes(args.train))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.01,
                            betas=(0.9, 0.95))
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "train.log"), "w")
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for gr in opt.param_groups:
            gr["lr"] = lr
        starts = rng.integers(0, len(data) - args.seq - 1, size=args.batch)
        batch = torch.stack([data[s:s + args.seq + 1] for s in starts])
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            msg = f"step {step} loss {loss.item():.4f} ({loss.item() / math.log(2):.3f} bits/byte) lr {lr:.2e} " \
                  f"{time.time() - t0:.0f} s"
            print(msg, flush=True)
            log.write(msg + "\n")
    log.close()

    if args.eval:
        with torch.no_grad():
            ev_model = copy.deepcopy(model)  # the bf16 checkpoint's values: everything but the router and its bias
            for sp in specs:
                if sp.kind not in ("router", "bias"):
                    prm = ev_model.p[TinyM3.key(sp.name)]
                    prm.copy_(prm.to(torch.bfloat16).to(torch.float32))
            ev = read_bytes([args.eval])[:-2]  # read_bytes appends two newlines
            n = min(args.eval_seqs, len(ev) // args.seq)
            seqs = torch.from_numpy(ev[:n * args.seq].reshape(n, args.seq))
            nll = torch.nn.functional.cross_entropy(ev_model(seqs)[:, :-1].reshape(-1, tc["vocab_size"]),
                                                    seqs[:, 1:].reshape(-1))
            msg = f"eval {args.eval}: {n} x {args.seq} bytes, bf16-rounded weights: perplexity {math.exp(nll.item()):.4f}, " \
                  f"{nll.item() / math.log(2):.4f} bits/byte"
            print(msg)
            with open(os.path.join(args.out, "train.log"), "a") as f:
                f.write(msg + "\n")
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
