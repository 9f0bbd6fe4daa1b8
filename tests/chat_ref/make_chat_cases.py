#!/usr/bin/env python3
"""Reference data for text/chat_tokens_test.cc: the served families' real chat templates
(templates/, sources in templates/SOURCES.md) rendered with Python's jinja2 as
transformers sets it up, and the rendered text tokenized by HF's `tokenizers` as
apply_chat_template(tokenize=True) does (encode(text, add_special_tokens=False)).

  make_chat_cases.py OUT_DIR

The tokenizers are tests/tokenizer_ref/make_tokenizers.py's (trained on the repository
corpus) with each family's special tokens added as its tokenizer.json has them. Writes
OUT_DIR/<tokenizer>/tokenizer.json and tokenizer_config.json, and OUT_DIR/cases.json:
{"tokenizers_version", "cases": [{"tokenizer", "template", "conversation", "context",
"text", "ids"} or {..., "raise"}]}. Run it with the test venv's Python
(scripts/install-deps.sh).
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tokenizer_ref"))
import make_tokenizers  # noqa: E402
from make_tokenizers import AddedToken, Tokenizer  # noqa: E402
import tokenizers  # noqa: E402

from chat_cases import render_cases  # noqa: E402

# DeepSeek-R1-Distill-Qwen's added tokens: sentence markers special, the rest not (as in
# its tokenizer.json), <think> and </think> plain added tokens.
DEEPSEEK_SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
DEEPSEEK_ADDED = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜tool▁calls▁begin｜>",
                  "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                  "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                  "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"]


def with_tokens(data, special=(), plain=()):
    """data (tokenizer.json as a dict) with more added tokens."""
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    return json.loads(tok.to_str())


def make_all(lines):
    """{name: (tokenizer.json dict, tokenizer_config dict)} and the template of each."""
    llama3 = make_tokenizers.make_llama3(lines)
    qwen_data, qwen_config = make_tokenizers.make_qwen2(lines)
    # Qwen3 has <think> and </think> as plain (non-special) added tokens.
    qwen = (with_tokens(qwen_data, plain=["<think>", "</think>"]), qwen_config)
    deepseek = (with_tokens(qwen_data, special=DEEPSEEK_SPECIAL, plain=DEEPSEEK_ADDED),
                {"bos_token": DEEPSEEK_SPECIAL[0], "eos_token": DEEPSEEK_SPECIAL[1]})
    mistral = make_tokenizers.make_mistral(lines)
    llama2 = make_tokenizers.make_llama2(lines)
    tokenizers_by_name = {"llama3": llama3, "qwen": qwen, "deepseek": deepseek,
                          "mistral": mistral, "llama2": llama2}
    templates = {"llama3_3": "llama3", "qwen2_5": "qwen", "qwen3": "qwen",
                 "deepseek_r1_distill_qwen": "deepseek", "mistral_nemo": "mistral",
                 "mixtral_v01": "mistral", "llama2_chat": "llama2"}
    return tokenizers_by_name, templates


def token_text(value):
    return value.get("content") if isinstance(value, dict) else value


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    lines = make_tokenizers.training_lines(
        make_tokenizers.read_corpus(os.path.join(HERE, "..", "model_gen", "corpus.txt")))
    tokenizers_by_name, templates = make_all(lines)
    loaded = {}
    for name, (data, config) in tokenizers_by_name.items():
        directory = os.path.join(out, name)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False)
        loaded[name] = (Tokenizer.from_file(path), config)
    cases = []
    for template, tokenizer_name in templates.items():
        tok, config = loaded[tokenizer_name]
        special_tokens = {key: token_text(config[key]) for key in ("bos_token", "eos_token")
                          if config.get(key) is not None}
        for case in render_cases(template, special_tokens):
            case["tokenizer"] = tokenizer_name
            if "text" in case:
                case["ids"] = tok.encode(case["text"], add_special_tokens=False).ids
            cases.append(case)
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "cases": cases}, f,
                  ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
