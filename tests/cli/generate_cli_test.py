#!/usr/bin/env python3
"""`m3serve generate` end to end: it runs through the engine, so chunking does not change greedy ids, stop_token_ids
end generation at the first stop id, min_tokens suppresses it until enough tokens exist, and --logprobs prints one
JSON line per generated token whose chosen logprob is the best when greedy.
Usage: generate_cli_test.py M3SERVE_BINARY FIXTURE_DIR"""
import json
import subprocess
import sys

PROMPT = ",".join(str(i) for i in range(1, 20))


def generate(binary, fixture, *args):
    out = subprocess.run([binary, "generate", "--model", fixture, "--prompt-ids", PROMPT, "--device", "cpu", *args],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    ids = [int(x) for x in out[0].split(",")]
    return ids, [json.loads(line) for line in out[1:]]


def main():
    binary, fixture = sys.argv[1], sys.argv[2]
    base, _ = generate(binary, fixture, "--max-tokens", "20", "--ignore-eos")
    chunked, _ = generate(binary, fixture, "--max-tokens", "20", "--ignore-eos", "--chunk", "3")
    assert base == chunked, (base, chunked)

    # A stop id that occurs after a few tokens (not at position 0, so min_tokens can push past it).
    k = next(i for i in range(1, len(base)) if base[i] not in base[:i])
    stopped, _ = generate(binary, fixture, "--max-tokens", "20", "--ignore-eos", "--stop-token-ids", str(base[k]))
    assert stopped == base[:k + 1], (stopped, base, k)
    held, _ = generate(binary, fixture, "--max-tokens", "20", "--ignore-eos", "--stop-token-ids", str(base[k]),
                       "--min-tokens", str(k + 2))
    assert held[:k] == base[:k] and held[k] != base[k] and len(held) > k + 1, (held, base, k)

    ids, lps = generate(binary, fixture, "--max-tokens", "4", "--ignore-eos", "--logprobs", "3")
    assert ids == base[:4]
    assert [lp["token"] for lp in lps] == ids, lps
    for lp in lps:
        assert len(lp["top"]) == 3 and lp["top"][0][0] == lp["token"] and lp["logprob"] <= 0, lp
    print("generate CLI: ok")


if __name__ == "__main__":
    main()
