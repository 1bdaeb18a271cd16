#!/usr/bin/env python3
"""Regenerates tests/fixtures/templates/llamacpp_chat_ids.json: the prompt ids
llama.cpp (node-llama-cpp 3.22.1's prebuilt CPU llama.cpp, bench/llamacpp/)
makes of chat conversations rendered by ExaServe's template interpreter, with
llama.cpp's server rule: a leading bos_token text is dropped when the
vocabulary adds BOS itself, then the text is tokenized with add_special and
parse_special (common/chat.cpp, llama_tokenize).

The model is a tiny random one under a Llama-3-style BPE vocabulary: the
committed tests/fixtures/tokenizer/bpe-vocab.json plus <|start_header_id|> and
<|end_header_id|> as control tokens, add_bos_token = true, and a family's
chat template. The C++ test (tests/template/chat_serving_test.cpp) rebuilds
the same file, sends the conversation to /v1/chat/completions and checks the
cluster ran exactly these ids.

Run from the repository root after building exaserve:
  python3 scripts/make_chat_ids_fixture.py
"""

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
EXASERVE = os.path.join(ROOT, "build", "bin", "exaserve")
OUT = os.path.join(ROOT, "tests", "fixtures", "templates", "llamacpp_chat_ids.json")

ADDED_CONTROL_TOKENS = ["<|start_header_id|>", "<|end_header_id|>"]

CONVERSATIONS = [
    ("llama3", [{"role": "system", "content": "You are terse. Ünïcødé 中文 👋"},
                {"role": "user", "content": "What's 2+2? Say \"four\".\n  Then <|eot_id|> stop."},
                {"role": "assistant", "content": "  four  "},
                {"role": "user", "content": "ok"}]),
    ("llama3", [{"role": "user", "content": "Hello"}]),
    ("chatml", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"}]),
]


def run(args, stdin=None):
    r = subprocess.run(args, input=stdin, capture_output=True, check=True)
    return r.stdout


def main():
    with open(os.path.join(ROOT, "tests", "fixtures", "tokenizer", "bpe-vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    vocab.pop("learned_from", None)
    for t in ADDED_CONTROL_TOKENS:
        vocab["tokens"].append(t)
        vocab["token_type"].append(3)
    vocab["add_bos_token"] = True
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        by_template = {}
        for template, messages in CONVERSATIONS:
            if template not in by_template:
                v = dict(vocab)
                with open(os.path.join(ROOT, "tests", "fixtures", "templates", template + ".jinja"), encoding="utf-8",
                          newline="") as f:
                    v["chat_template"] = f.read()
                vpath = os.path.join(tmp, template + ".json")
                with open(vpath, "w", encoding="utf-8") as f:
                    json.dump(v, f)
                model = os.path.join(tmp, template + ".gguf")
                run([EXASERVE, "gen-model", "--preset", "tiny", "--seed", "1", "--vocab", vpath, "--out", model])
                by_template[template] = model
            model = by_template[template]
            rendered = run([EXASERVE, "chat-template", "--model", model, "--messages", json.dumps(messages)]).decode()
            bos = "<|begin_of_text|>"
            text = rendered[len(bos):] if rendered.startswith(bos) else rendered
            ids = json.loads(run(["node", os.path.join(ROOT, "bench", "llamacpp", "ref.mjs"), "tokenize", model,
                                  "--special", "--bos"], json.dumps([text]).encode()))[0]
            cases.append({"template": template, "messages": messages, "rendered": rendered, "llamacpp_ids": ids})
    doc = {"generator": "scripts/make_chat_ids_fixture.py: ids from node-llama-cpp 3.22.1 (prebuilt CPU llama.cpp), "
                        "tokenize --special --bos of the rendered prompt without its leading bos_token text",
           "vocab": "tests/fixtures/tokenizer/bpe-vocab.json + control tokens " + ", ".join(ADDED_CONTROL_TOKENS) +
                    ", add_bos_token = true",
           "added_control_tokens": ADDED_CONTROL_TOKENS,
           "cases": cases}
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases written to {OUT}")


if __name__ == "__main__":
    sys.exit(main())
