#!/usr/bin/env python3
"""The load flags of `serve`, `generate` and `score` (--dtype, --load-format, --num-layers, --attention): bad values
and what the CPU cannot run end with a clear message and exit code 1 or 105 (CLI11's validation code) — never a
crash (a signal, or exit code 2, m3serve's "internal error") — and good values work on the CPU.
Usage: load_flags_cli_test.py M3SERVE_BINARY FIXTURE_DIR"""
import subprocess
import sys


def run(binary, args):
    p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def main():
    binary, fixture = sys.argv[1], sys.argv[2]
    failures = []

    def expect_error(args, needle):
        code, out = run(binary, args)
        if code <= 0 or code == 2 or needle not in out:
            failures.append(f"{args}: exit {code}, expected a clear error containing {needle!r}; got: {out[-400:]}")

    gen = ["generate", "--model", fixture, "--prompt-ids", "1,2,3", "--max-tokens", "2"]
    score = ["score", "--model", fixture, "--ids", "1,2,3"]
    serve = ["serve", "--model", fixture, "--port", "0"]
    for base in (gen, score, serve):
        # The error names the flag and the accepted words (not CLI11's internal enum numbers).
        expect_error(base + ["--dtype", "float16"], "--dtype: 'float16' is not one of: auto, bfloat16, float32")
        expect_error(base + ["--load-format", "pt"], "--load-format: 'pt' is not one of: auto, dummy, safetensors")
        expect_error(base + ["--attention", "sparse"], "--attention: 'sparse' is not one of: dense, msa, msa-v1")
        expect_error(base + ["--num-layers", "-3"], "--num-layers")
        expect_error(base + ["--num-layers", "abc"], "--num-layers")
    for base in (gen, score):
        expect_error(base + ["--device", "cpu", "--dtype", "bfloat16"], "--dtype bfloat16 needs --device cuda")
        expect_error(base + ["--device", "cpu", "--attention", "dense"], "--attention dense needs --device cuda")
        expect_error(base + ["--device", "cpu", "--num-layers", "99"], "--num-layers 99 exceeds")

    # Good values run: a truncated model, dummy weights, float32 on the CPU.
    for extra in (["--num-layers", "4"], ["--load-format", "dummy", "--num-layers", "2"], ["--dtype", "float32"]):
        code, out = run(binary, gen + ["--device", "cpu"] + extra)
        if code != 0:
            failures.append(f"generate {extra}: exit {code}: {out[-400:]}")
        code, out = run(binary, score + ["--device", "cpu"] + extra)
        if code != 0 or '"logits"' not in out:
            failures.append(f"score {extra}: exit {code}: {out[-400:]}")

    for f in failures:
        print("FAIL:", f)
    print(f"load flags: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
