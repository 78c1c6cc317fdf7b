#!/usr/bin/python3
"""Reference renderer for the C++ Jinja/chat-template tests: Python jinja2, configured the way
transformers' apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, {% generation %}, tojson with ensure_ascii=False, raise_exception and
strftime_now globals).

Usage: reference_render.py JOBS.json OUT.json   (run with /usr/bin/python3: Debian's python3-jinja2)

JOBS.json: {"jobs": [job, ...]} where a job is either
  {"template": SRC, "context": {...}}                                   (render with that context) or
  {"template": SRC, "inputs": {messages, tools, add_generation_prompt, extra_context},
   "bos_token": S, "eos_token": S}                                      (build the context like
                                                                         transformers does, then render)
OUT.json: [{"ok": true, "out": TEXT} | {"ok": false, "error": "Type: message"}, ...] in job order.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(Extension):
    # transformers' AssistantTracker, minus the mask bookkeeping: {% generation %} renders its body.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def build_context(job):
    # Mirrors m3::chat_template_context (and transformers' render_jinja_template).
    inputs = job["inputs"]
    ctx = {
        "messages": inputs.get("messages", []),
        "tools": inputs.get("tools"),
        "documents": None,
        "add_generation_prompt": inputs.get("add_generation_prompt", True),
    }
    if job.get("bos_token"):
        ctx["bos_token"] = job["bos_token"]
    if job.get("eos_token"):
        ctx["eos_token"] = job["eos_token"]
    ctx.update(inputs.get("extra_context") or {})
    return ctx


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        jobs = json.load(f)["jobs"]
    env = make_env()
    compiled = {}
    results = []
    for job in jobs:
        try:
            src = job["template"]
            if src not in compiled:
                compiled[src] = env.from_string(src)
            ctx = job["context"] if "context" in job else build_context(job)
            results.append({"ok": True, "out": compiled[src].render(**ctx)})
        except Exception as e:  # every failure is a result the C++ side must mirror
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
