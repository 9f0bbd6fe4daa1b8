#!/usr/bin/env python3
"""Reference data for text/gguf_tokenizer_test.cc: GGUF files that carry only a tokenizer,
written with the `gguf` package as llama.cpp's convert_hf_to_gguf.py writes them, and what
HF's `tokenizers` makes of thousands of strings with the tokenizer each file stands for.

Byte-level ("gpt2") vocabularies: a BPE tokenizer is trained with `tokenizers` in the
style of a model family (the split regex of the family's tokenizer.json, as
tests/tokenizer_ref/make_tokenizers.py writes them), and that trained tokenizer.json is the
reference; the GGUF file holds its tokens (added tokens as their text), merges, token types
(special added tokens CONTROL, other added tokens USER_DEFINED) and the pre-tokenizer's
llama.cpp name. So the C++ side must rebuild the original tokenizer from the name alone.

Sentencepiece-style ("llama") vocabularies: a sentencepiece-like vocabulary is trained
(BPE on Metaspace words, <unk> <s> </s>, the 256 <0xNN> byte tokens, scores -rank, token
types as sentencepiece's), the file holds tokens, scores and types but no merges, as
convert_hf_to_gguf writes a tokenizer.model. The reference is the tokenizer transformers'
GGUF loader builds for such a file (LlamaTokenizer: BPE with byte fallback, merges derived
from the scores by transformers' generate_merges rule, restated below; Metaspace with
prepend_scheme "first"; the control and unknown tokens special), run by `tokenizers`.

  make_gguf_tokenizers.py --corpus tests/model_gen/corpus.txt --out DIR [--strings N]

Output, under DIR: <name>/tokenizer.gguf, <name>/cases.json ({"encode": [{"text", "ids",
"ids_special", "decoded"}], "decode": [{"ids", "text"}], "bos", "eos", "pad",
"chat_template"}) and names.json. Deterministic for a corpus and `tokenizers` version. Run
it with the test venv's Python (scripts/install-deps.sh).
"""

import argparse
import json
import os
import random
import sys

try:
    import gguf
    import tokenizers
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers,
                            processors)
except ImportError as e:  # The C++ test turns this into its failure message.
    sys.exit(f"cannot import gguf/tokenizers ({e}); run scripts/install-deps.sh")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "tokenizer_ref"))
import make_tokenizers as mt  # noqa: E402  (training, test strings, split regexes)

GPT2_SPLIT = None  # ByteLevel's own regex.
TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
                 "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
                 "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
                 "\n\n{% endif %}")


# --- Byte-level vocabularies ------------------------------------------------------------

def byte_level_pre_tokenizer(style):
    if style == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if style == "digits":  # SmolLM / StarCoder
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(style), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# name: (tokenizer.ggml.pre, split style, ignore_merges, specials (control), user-defined,
#        bos, eos, pad, add_bos, chat template)
BYTE_LEVEL = {
    "gpt2": ("gpt2", "gpt2", False,
             ["<|endoftext|>", "<\uff5cend\u2581of\u2581sentence\uff5c>"], ["<tool_call>"],
             "<|endoftext|>", "<|endoftext|>", None, False, None),
    "llama-bpe": ("llama-bpe", mt.LLAMA3_SPLIT, True,
                  ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"], [],
                  "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>", True, CHAT_TEMPLATE),
    "qwen2": ("qwen2", mt.QWEN2_SPLIT, False,
              ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["<tool_call>", "</tool_call>"],
              None, "<|im_end|>", "<|endoftext|>", False, None),
    "smollm": ("smollm", "digits", False, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], [],
               "<|im_start|>", "<|im_end|>", None, False, None),
    "tekken": ("tekken", TEKKEN_SPLIT, True, ["<s>", "</s>", "[INST]", "[/INST]"], [],
               "<s>", "</s>", None, True, None),
}


def make_byte_level(name, lines):
    pre, style, ignore_merges, specials, user, bos, eos, pad, add_bos, template = BYTE_LEVEL[name]
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = byte_level_pre_tokenizer(style)
    tok.decoder = decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=2500, special_tokens=[], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer)
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in specials])
    tok.add_tokens([AddedToken(u, normalized=False, special=False) for u in user])
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    data = json.loads(tok.to_str())
    # Training builds a new model; the flag is set on what it made.
    data["model"]["ignore_merges"] = ignore_merges
    tok = Tokenizer.from_str(json.dumps(data))
    size = tok.get_vocab_size(with_added_tokens=True)
    added = {a["id"]: a for a in data["added_tokens"]}
    tokens, types = [], []
    for i in range(size):
        if i in added:  # convert_hf_to_gguf: an added token's text, CONTROL if special.
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"]
                         else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(tok.id_to_token(i))
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    ids = {"bos": bos, "eos": eos, "pad": pad}
    meta = {"model": "gpt2", "pre": pre, "tokens": tokens, "types": types, "merges": merges,
            "scores": None, "add_bos": add_bos, "add_eos": False, "add_space_prefix": None,
            "unk": None, "template": template,
            **{k: (tok.token_to_id(v) if v is not None else None) for k, v in ids.items()}}
    return tok, meta, specials + user


# --- Sentencepiece-style vocabularies ---------------------------------------------------

def generate_merges(tokens, scores):
    """transformers' generate_merges(vocab, vocab_scores) for a GGUF without merges: every
    split of a token into two tokens, ranked by the token's score (highest first), then
    the longer left part, then the longer right part; stable otherwise."""
    vocab = {t: i for i, t in enumerate(tokens)}
    vocab_scores = dict(zip(tokens, scores))
    merges = []
    for merge, score in vocab_scores.items():
        local = []
        for index in range(1, len(merge)):
            left, right = merge[:index], merge[index:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(m[0], m[1]) for m in merges]


def make_spm(name, lines):
    """A Llama-2-like sentencepiece vocabulary: <unk> <s> </s>, the byte tokens, then the
    pieces of a BPE trained on Metaspace words, scored -rank; [INST] [/INST] control,
    <tool> user-defined."""
    add_space_prefix = name != "llama-spm-noprefix"
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=1800, show_progress=False,
                                             limit_alphabet=150)
    trained.train_from_iterator(lines, trainer=trainer)
    pieces = sorted(trained.get_vocab().items(), key=lambda kv: kv[1])
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256
    scores = [0.0] * len(tokens)
    for rank, (piece, _) in enumerate(pieces):
        if piece in tokens:
            continue
        tokens.append(piece)
        types.append(T.NORMAL)
        scores.append(-float(rank))
    for text, kind in [("[INST]", T.CONTROL), ("[/INST]", T.CONTROL), ("<tool>", T.USER_DEFINED)]:
        tokens.append(text)
        types.append(kind)
        scores.append(0.0)
    vocab = {t: i for i, t in enumerate(tokens)}
    # What transformers' GGUF loader makes of it (LlamaTokenizer + the GGUF token types).
    tok = Tokenizer(models.BPE(vocab=vocab, merges=generate_merges(tokens, scores),
                               unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if add_space_prefix else "never",
        split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, k in zip(tokens, types) if k in (T.CONTROL, T.UNKNOWN)])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, k in zip(tokens, types) if k == T.USER_DEFINED])
    add_bos, add_eos = (True, False) if add_space_prefix else (False, True)
    single = (["<s>"] if add_bos else []) + ["$A"] + (["</s>"] if add_eos else [])
    tok.post_processor = processors.TemplateProcessing(
        single=" ".join(single), special_tokens=[("<s>", 1), ("</s>", 2)])
    meta = {"model": "llama", "pre": "default", "tokens": tokens, "types": types,
            "merges": None, "scores": scores, "add_bos": add_bos, "add_eos": add_eos,
            "add_space_prefix": add_space_prefix, "unk": 0, "bos": 1, "eos": 2, "pad": None,
            "template": None}
    return tok, meta, ["<s>", "</s>", "<unk>", "[INST]", "[/INST]", "<tool>"]


MAKERS = {name: make_byte_level for name in BYTE_LEVEL}
MAKERS.update({"llama-spm": make_spm, "llama-spm-noprefix": make_spm})


def write_gguf(path, meta):
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model(meta["model"])
    w.add_tokenizer_pre(meta["pre"])
    w.add_token_list(meta["tokens"])
    w.add_token_types([int(t) for t in meta["types"]])
    if meta["scores"] is not None:
        w.add_token_scores(meta["scores"])
    if meta["merges"] is not None:
        w.add_token_merges(meta["merges"])
    for key, add in [("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                     ("unk", w.add_unk_token_id), ("pad", w.add_pad_token_id)]:
        if meta[key] is not None:
            add(meta[key])
    w.add_add_bos_token(meta["add_bos"])
    w.add_add_eos_token(meta["add_eos"])
    if meta["add_space_prefix"] is not None:
        w.add_bool("tokenizer.ggml.add_space_prefix", meta["add_space_prefix"])
    if meta["template"] is not None:
        w.add_chat_template(meta["template"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--strings", type=int, default=2000, help="test strings per tokenizer")
    parser.add_argument("--decodes", type=int, default=600, help="random id sequences each")
    parser.add_argument("--tokenizers", default=",".join(MAKERS))
    args = parser.parse_args()
    wanted = args.tokenizers.split(",")
    for name in wanted:
        if name not in MAKERS:
            sys.exit(f"unknown tokenizer {name!r}; known: {', '.join(MAKERS)}")
    corpus = mt.read_corpus(args.corpus)
    lines = mt.training_lines(corpus)
    os.makedirs(args.out, exist_ok=True)
    for name in wanted:
        rng = random.Random(f"conveyor-gguf-{name}")
        tok, meta, specials = MAKERS[name](name, lines)
        directory = os.path.join(args.out, name)
        os.makedirs(directory, exist_ok=True)
        write_gguf(os.path.join(directory, "tokenizer.gguf"), meta)
        strings = mt.make_strings(rng, corpus, specials, args.strings)
        plain = [e.ids for e in tok.encode_batch(strings, add_special_tokens=False)]
        framed = [e.ids for e in tok.encode_batch(strings, add_special_tokens=True)]
        decoded = tok.decode_batch(plain, skip_special_tokens=False)
        sequences = mt.random_id_sequences(rng, tok, args.decodes)
        random_texts = tok.decode_batch(sequences, skip_special_tokens=False)
        cases = {
            "tokenizers_version": tokenizers.__version__,
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "bos": meta["bos"] if meta["bos"] is not None else -1,
            "eos": meta["eos"] if meta["eos"] is not None else -1,
            "pad": meta["pad"] if meta["pad"] is not None else -1,
            "chat_template": meta["template"],
            "encode": [{"text": s, "ids": p, "ids_special": f, "decoded": d}
                       for s, p, f, d in zip(strings, plain, framed, decoded)],
            "decode": [{"ids": i, "text": t} for i, t in zip(sequences, random_texts)],
        }
        with open(os.path.join(directory, "cases.json"), "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False)
    with open(os.path.join(args.out, "names.json"), "w") as f:
        json.dump(wanted, f)


if __name__ == "__main__":
    main()
