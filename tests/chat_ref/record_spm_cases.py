#!/usr/bin/env python3
"""Records tests/chat_ref/spm_cases.json: what Hugging Face transformers makes of
sentencepiece models (tokenizer.model + tokenizer_config.json, as Llama 2 and Mistral
ship them) for plain texts and for real chat templates rendered with jinja2, as
apply_chat_template(tokenize=True) returns it with AutoTokenizer's default tokenizer.

  /opt/conveyor-hf-venv/bin/python tests/chat_ref/record_spm_cases.py

Not run in CI: transformers is no CI dependency. The models are trained here with
spm_train on tests/model_gen/corpus.txt, with the test model's options (the Llama 2 style
model is byte for byte tests/model_gen's tokenizer.model) and, for the Mistral style,
[INST], [/INST] and [TOOL_CALLS] as control pieces. The fixture keeps each model's spm_train
command and SHA-256; text/chat_tokens_test.cc trains it again and checks the hash.

It also records, for the README, where HF's sentencepiece-backed (slow)
SentencePieceBackend disagrees with the default (fast) tokenizer.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model_gen"))
from make_test_model import SPM_OPTIONS  # noqa: E402

import sentencepiece  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from transformers.tokenization_utils_sentencepiece import SentencePieceBackend  # noqa: E402

from chat_cases import render_cases  # noqa: E402

CONTROL = ["[INST]", "[/INST]", "[TOOL_CALLS]"]
MODELS = {
    "llama2": ["spm_train", "--input=corpus.txt", "--model_prefix=tokenizer",
               "--vocab_size=512"] + SPM_OPTIONS,
    "mistral": ["spm_train", "--input=corpus.txt", "--model_prefix=tokenizer",
                "--vocab_size=512", "--control_symbols=" + ",".join(CONTROL)] + SPM_OPTIONS,
}

TEXTS = ["hello world", " hello", "  two leading", "trailing ", "a  b   c", "\n\nlines\n",
         "<s>hello</s>", "<s> hello", "x<s>y", "<s", "<unk>z", "a<unk> b", "</s></s>",
         "[INST] hi [/INST] ok", "[INST]hi[/INST]", "[INST]  two[/INST]\n", "[TOOL_CALLS][",
         "Grüße 🚀 你好", "▁already", "<s>▁x", "[INST]▁y[/INST]", "ab[INST]", "\t[INST]\t"]


def added_tokens_decoder(model_path):
    """The tokenizer_config.json entries of the model's special pieces."""
    sp = sentencepiece.SentencePieceProcessor(model_file=model_path)
    entries = {}
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):
            entries[str(i)] = {"content": sp.id_to_piece(i), "lstrip": False, "normalized": False,
                               "rstrip": False, "single_word": False, "special": True}
    return entries


def configs(model_paths):
    base = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}
    out = []
    for model, templates in (("llama2", ["llama2_chat"]),
                             ("mistral", ["mixtral_v01", "mistral_nemo"])):
        for legacy in (True, False, None):
            config = dict(base, added_tokens_decoder=added_tokens_decoder(model_paths[model]))
            if legacy is not None:
                config["legacy"] = legacy
            out.append({"name": f"{model}_legacy_{legacy}", "model": model,
                        "tokenizer_config": config, "templates": templates})
    return out


def main():
    work = tempfile.mkdtemp()
    shutil.copyfile(os.path.join(HERE, "..", "model_gen", "corpus.txt"),
                    os.path.join(work, "corpus.txt"))
    models, paths = {}, {}
    for name, command in MODELS.items():
        subprocess.run(command, cwd=work, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        os.makedirs(os.path.join(work, name))
        paths[name] = os.path.join(work, name, "tokenizer.model")
        os.rename(os.path.join(work, "tokenizer.model"), paths[name])
        with open(paths[name], "rb") as f:
            models[name] = {"spm_train": command, "sha256": hashlib.sha256(f.read()).hexdigest()}
    fixture = {"recorded_with": {
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "sentencepiece": sentencepiece.__version__,
        "spm_train": subprocess.run(["spm_train", "--version"], capture_output=True,
                                    text=True).stdout.strip(),
        "command": "/opt/conveyor-hf-venv/bin/python tests/chat_ref/record_spm_cases.py"},
        "models": models, "configs": [], "slow_disagrees": []}
    for spec in configs(paths):
        directory = os.path.join(work, spec["name"])
        os.makedirs(directory)
        shutil.copyfile(paths[spec["model"]], os.path.join(directory, "tokenizer.model"))
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump(spec["tokenizer_config"], f)
        fast = AutoTokenizer.from_pretrained(directory)
        slow = SentencePieceBackend.from_pretrained(directory)
        entry = {"name": spec["name"], "model": spec["model"],
                 "tokenizer_config": spec["tokenizer_config"], "hf_class": type(fast).__name__,
                 "texts": [], "chats": []}
        for text in TEXTS:
            ids = fast.encode(text, add_special_tokens=False)
            entry["texts"].append({"text": text, "ids": ids})
            slow_ids = slow.encode(text, add_special_tokens=False)
            if slow_ids != ids:
                fixture["slow_disagrees"].append({"config": spec["name"], "text": text,
                                                  "fast": ids, "slow": slow_ids})
        for template in spec["templates"]:
            for case in render_cases(template, {"bos_token": "<s>", "eos_token": "</s>"}):
                if "text" in case:
                    # What apply_chat_template(tokenize=True) returns: the same text encoded
                    # without framing tokens.
                    ids = fast.apply_chat_template(
                        case["context"]["messages"], tokenize=True,
                        add_generation_prompt=case["context"]["add_generation_prompt"],
                        chat_template=case_template(template), return_dict=False)
                    assert ids == fast.encode(case["text"], add_special_tokens=False), case
                    case["ids"] = ids
                entry["chats"].append(case)
        fixture["configs"].append(entry)
    with open(os.path.join(HERE, "spm_cases.json"), "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
    shutil.rmtree(work)


def case_template(name):
    with open(os.path.join(HERE, "templates", name + ".jinja"), encoding="utf-8") as f:
        return f.read()


if __name__ == "__main__":
    main()
