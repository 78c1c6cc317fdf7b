#!/usr/bin/env python3
"""`m3serve chat-template` and the serving template rules, end to end through the binary:
  - the prompt printed for a request body is exactly what Python jinja2 renders from the normalised request (root
    first message kept, OpenAI image_url / video_url parts as {"type": "image"/"video"} in order, content part arrays
    passed to a template that walks them, tool-call argument strings decoded), with the model's template or
    --chat-template FILE;
  - a model directory without a template: `chat-template` and `serve` stop with a message naming --chat-template;
  - a template error: exit 1 with the template's message and no server path;
  - MiniMax's released template, when a local copy exists (.gl/minimax_m3_official.jinja or
    $M3_OFFICIAL_M3_TEMPLATE), renders the same request like Python jinja2 (else: skipped, with a message).
Usage: chat_template_cli_test.py M3SERVE_BINARY SOURCE_DIR   (run with /usr/bin/python3: Debian's python3-jinja2)"""
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

REQUEST = {
    "model": "whatever-the-client-says",
    "messages": [
        {"role": "root", "content": "ROOT"},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "text", "text": "Compare "},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": " and "},
            {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
        ]},
        {"role": "assistant", "content": None, "reasoning_content": "look first", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "lookup", "arguments": "{\"q\": \"cats\", \"n\": 2, \"skip\": null}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "two cats"},
    ],
    "tools": [{"type": "function", "function": {"name": "lookup", "description": "d",
                                                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
    "chat_template_kwargs": {"thinking_mode": "enabled"},
}


def normalised(req):
    """The request as the server hands it to the template (written out independently of the C++)."""
    msgs = copy.deepcopy(req["messages"])
    msgs[2]["content"] = [{"type": "text", "text": "Compare "}, {"type": "image"}, {"type": "text", "text": " and "},
                          {"type": "video"}]
    msgs[3]["content"] = ""
    msgs[3]["tool_calls"][0]["function"]["arguments"] = {"q": "cats", "n": 2, "skip": None}
    return {"messages": msgs, "tools": req["tools"], "add_generation_prompt": True,
            "extra_context": req["chat_template_kwargs"]}


def python_render(src_dir, template_text, inputs):
    sys.path.insert(0, os.path.join(src_dir, "tests", "chat_template"))
    import reference_render  # noqa: E402 (Python jinja2 configured like transformers)
    env = reference_render.make_env()
    return env.from_string(template_text).render(**reference_render.build_context({"inputs": inputs}))


def run(binary, *args):
    return subprocess.run([binary, *args], capture_output=True, text=True)


def main():
    binary, src = sys.argv[1], sys.argv[2]
    synthetic_path = os.path.join(src, "tests", "chat_template", "m3_format_synthetic.jinja")
    synthetic = open(synthetic_path, encoding="utf-8").read()
    tmp = tempfile.mkdtemp(prefix="m3_chat_template_cli_")
    try:
        model = os.path.join(tmp, "secret-model-dir")
        os.makedirs(model)
        req_path = os.path.join(tmp, "request.json")
        with open(req_path, "w", encoding="utf-8") as f:
            json.dump(REQUEST, f)

        # No template anywhere: both the inspector and the server refuse, naming the flag.
        r = run(binary, "chat-template", "--model", model, "--request", req_path)
        assert r.returncode == 1 and "--chat-template" in r.stderr, (r.returncode, r.stderr)
        r = run(binary, "serve", "--model", model, "--port", "0")
        assert r.returncode == 1 and "--chat-template" in r.stderr, (r.returncode, r.stderr)

        want = python_render(src, synthetic, normalised(REQUEST))
        assert "]<]image[>[" in want and "ROOT" in want, want

        # --chat-template FILE, then the model's own chat_template.jinja: the same exact text.
        r = run(binary, "chat-template", "--model", model, "--chat-template", synthetic_path, "--request", req_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout == want, f"--- got\n{r.stdout}\n--- want\n{want}"
        assert "media 0: image (image_url)" in r.stderr and "media 1: video (video_url)" in r.stderr, r.stderr
        shutil.copy(synthetic_path, os.path.join(model, "chat_template.jinja"))
        r = subprocess.run([binary, "chat-template", "--model", model, "--request", "-"], input=json.dumps(REQUEST),
                           capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout == want, r.stderr

        # A template error: the template's message, the file name, never the directory.
        bad = {"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "orphan"}]}
        with open(req_path, "w", encoding="utf-8") as f:
            json.dump(bad, f)
        r = run(binary, "chat-template", "--model", model, "--request", req_path)
        assert r.returncode == 1, r
        assert "a tool message needs a preceding assistant tool call" in r.stderr and "400" in r.stderr, r.stderr
        assert tmp not in r.stderr, r.stderr

        official = os.environ.get("M3_OFFICIAL_M3_TEMPLATE") or os.path.join(src, ".gl", "minimax_m3_official.jinja")
        if os.path.exists(official):
            with open(req_path, "w", encoding="utf-8") as f:
                json.dump(REQUEST, f)
            r = run(binary, "chat-template", "--model", model, "--chat-template", official, "--request", req_path)
            assert r.returncode == 0, r.stderr
            want = python_render(src, open(official, encoding="utf-8").read(), normalised(REQUEST))
            assert r.stdout == want, f"--- got\n{r.stdout}\n--- want\n{want}"
            assert r.stdout.startswith("]~!b[]~b]system\nROOT\n\n<thinking_instructions>"), r.stdout
            assert "]~b]user\nCompare ]<]image[>[ and ]<]video[>[[e~[" in r.stdout, r.stdout
            print("chat-template CLI: official MiniMax-M3 template renders like Python jinja2")
        else:
            print("chat-template CLI: official MiniMax-M3 template not present (.gl/minimax_m3_official.jinja); "
                  "that comparison is skipped")
        print("chat-template CLI: ok")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
