#!/usr/bin/env python3
"""Reference data for text/hf_tokenizer_test.cc, made with HF's `tokenizers` package.

Trains six small BPE tokenizers on the repository corpus, each set up in the style of a
model family (the regexes and settings are written here, not copied from any model's
files), writes each one's tokenizer.json and tokenizer_config.json, and what `tokenizers`
makes of a few thousand test strings: ids with and without special tokens, the decoded
text of those ids, and the text of random id sequences. It also sweeps every code point
through the regex classes, predicates and normalizers the C++ side reimplements.

  make_tokenizers.py --corpus tests/model_gen/corpus.txt --out DIR [--strings N]
      [--tokenizers gpt2,llama3,...] [--sweeps only|no]

Output, under DIR: <name>/tokenizer.json, <name>/tokenizer_config.json, <name>/cases.json
({"encode": [{"text", "ids", "ids_special", "decoded"}], "decode": [{"ids", "text"}]}),
names.json (the tokenizer names) and sweeps.json. Deterministic for a given corpus and
`tokenizers` version. Run it with the test venv's Python (scripts/install-deps.sh).
"""

import argparse
import json
import os
import random
import sys

try:
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
    import tokenizers
except ImportError as e:  # The C++ test turns this into its failure message.
    sys.exit(f"cannot import tokenizers ({e}); run scripts/install-deps.sh")

# --- Split regexes, in the style of the model families ---------------------------------

# Llama 3 style: contractions case-insensitively, letters with one leading non-letter,
# numbers in groups of up to three digits, punctuation runs keeping their line breaks,
# then whitespace (the last run of spaces before a word stays with the word).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2 style: as above but every digit on its own.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Text beyond the (English, ASCII) corpus, so the vocabularies hold some accented, Cyrillic,
# Greek and CJK pieces; emoji and most scripts stay out (byte fallback, unknown bytes).
EXTRA_TRAINING_TEXT = """\
Le café de la gare est fermé le dimanche; l'élève a préféré la crème brûlée.
Die Größe des Förderbands überrascht die Arbeiter in der Fabrik.
Конвейер работает днём и ночью, а склад закрывается в восемь.
Η μηχανή σταματά όταν τελειώνει η βάρδια.
工厂的传送带每天运行十二个小时，工人们轮流休息。
東京の工場では、新しいベルトが毎朝動き始める。
공장의 컨베이어 벨트는 매일 아침 여섯 시에 움직입니다.
def step(batch):\n    return [x * 2 for x in batch if x is not None]
for (int i = 0; i < n; ++i) { total += values[i]; }
"""

SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\t\t", "\u00a0", "\u3000",
          "\u2003", "\u0085", "\u180e", "\u2028", "\u200b", "\x0b", "\x0c", "    "]
PUNCT = [".", ",", "!", "?", "...", "--", "\"", "'", "(", ")", "[", "]", "{", "}", ":", ";",
         "#", "@", "$", "%", "^", "&", "*", "_", "=", "+", "<", ">", "/", "\\", "|", "~", "`",
         "«", "»", "“", "”", "—", "…", "¿", "¡", "、", "。", "！", "？"]
EMOJI = ["🚀", "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🏳️‍🌈", "🤖", "✅", "🧪", "🫠", "🦀"]
WORDS_EXTRA = ["café", "cafe\u0301", "naïve", "Ångström", "A\u030angstro\u0308m", "straße",
               "İstanbul", "ΣΊΣΥΦΟΣ", "Привет", "你好", "世界", "日本語", "한국어",
               "\u1100\u1161\u11a8", "مرحبا", "नमस्ते", "ﬁle", "①②③", "Ⅻ", "x²", "½",
               "ＡＢＣ", "ｶﾀｶﾅ", "don't", "I'M", "we'Re", "they'VE", "it'ſ", "O'Neil",
               "3.14159", "1,250", "2,406", "0x7fff", "1e-9", "٣٤٥", "१२३", "\u0301",
               "e\u0301\u0302", "\u0000", "\x7f", "\ufeff", "\ufffd", "\U0001d400", "𝔘𝔫𝔦",
               # Marks and compatibility characters from after Unicode 9.0, which HF's
               # normalization tables predate.
               "a\u1df6\u0316", "e\u0316\U00010d24\u0301", "\U0001f16c", "\u32ff", "\ua7f2"]
CODE = ["def f(x):\n    return x ** 2\n", "if (a && b) { return c; }",
        "for i in range(10):\n\tprint(i)", "<div class=\"x\">text</div>", "SELECT * FROM t;",
        "std::vector<int> v{1, 2, 3};", "    indented\n        more\n", "a = b\r\nc = d\r\n",
        "x=1;y=2", "// comment\n/* block */", "#include <stdio.h>", "λx.x", "{\"k\": [1, 2]}"]


def read_corpus(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def training_lines(corpus):
    lines = [line for line in corpus.splitlines() if line.strip()]
    return lines + EXTRA_TRAINING_TEXT.splitlines() * 20


# --- The tokenizers --------------------------------------------------------------------

def train(tok, lines, vocab_size, special_tokens=(), **trainer_args):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                  show_progress=False, **trainer_args)
    tok.train_from_iterator(lines, trainer=trainer)


def with_byte_fallback(tok, first_specials):
    """Returns tok's JSON with <0x00>..<0xFF> right after the first special tokens (where
    sentencepiece-converted vocabularies keep them) and byte_fallback on."""
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    new_vocab = {}
    for token, _ in ordered[:first_specials]:
        new_vocab[token] = len(new_vocab)
    for b in range(256):
        new_vocab[f"<0x{b:02X}>"] = len(new_vocab)
    for token, _ in ordered[first_specials:]:
        if token not in new_vocab:
            new_vocab[token] = len(new_vocab)
    data["model"]["vocab"] = new_vocab
    data["model"]["byte_fallback"] = True
    next_id = len(new_vocab)
    for added in sorted(data["added_tokens"], key=lambda a: a["id"]):
        if added["content"] in new_vocab:
            added["id"] = new_vocab[added["content"]]
        else:  # Added tokens outside the vocabulary follow it.
            added["id"] = next_id
            next_id += 1
    return data


def legacy_merges(data):
    """The older "a b" merges format (valid here: no token holds a space)."""
    data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                               for m in data["model"]["merges"]]
    return data


def make_gpt2(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    train(tok, lines, 3000, ["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # RoBERTa-style mask (lstrip), a multi-word added token, a single_word one.
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tok.add_tokens([AddedToken("Conveyor Works", normalized=False),
                    AddedToken("belt", single_word=True, normalized=False)])
    data = legacy_merges(json.loads(tok.to_str()))
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": None}
    return data, config


def make_llama3(lines):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, lines, 3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]
    specials += [f"<|reserved_special_token_{i}|>" for i in range(8)]
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    data = json.loads(tok.to_str())
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
              "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"}
    return data, config


def make_qwen2(lines):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    train(tok, lines, 3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    # Non-special added tokens, one of them normalized (matched after NFC).
    tok.add_tokens([AddedToken("<tool_call>", normalized=False, special=False),
                    AddedToken("</tool_call>", normalized=False, special=False),
                    AddedToken("café", normalized=True, special=False)])
    data = json.loads(tok.to_str())
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    return data, config


def make_llama2(lines):
    """Llama 2 / legacy Mistral: Prepend + Replace normalizer, no pre-tokenizer, byte
    fallback, decoder undoing it all."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    # Trained on Metaspace words, as sentencepiece does, then run on the whole text.
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    train(tok, lines, 2000, ["<unk>", "<s>", "</s>"], limit_alphabet=150)
    tok.add_special_tokens([AddedToken("[INST]", rstrip=True, special=True),
                            AddedToken("[/INST]", lstrip=True, special=True)])
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    data = with_byte_fallback(tok, 3)
    data["post_processor"]["special_tokens"]["<s>"]["ids"] = [data["model"]["vocab"]["<s>"]]
    config = {"bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False},
              "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False},
              "pad_token": None, "unk_token": "<unk>", "add_bos_token": True}
    return data, config


def make_mistral(lines):
    """Newer sentencepiece-style files: a Metaspace pre-tokenizer prepending only at the
    text's start, digits split, byte fallback, a Metaspace decoder."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(prepend_scheme="first", split=True),
        pre_tokenizers.Digits(individual_digits=True)])
    train(tok, lines, 2000, ["<unk>", "<s>", "</s>"], limit_alphabet=150)
    tok.add_special_tokens(["[INST]", "[/INST]", "[TOOL_CALLS]"])
    tok.decoder = decoders.Sequence([decoders.Metaspace(prepend_scheme="first"),
                                     decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                       special_tokens=[("<s>", 1), ("</s>", 2)])
    data = with_byte_fallback(tok, 3)
    vocab = data["model"]["vocab"]
    for name in ("<s>", "</s>"):
        data["post_processor"]["special_tokens"][name]["ids"] = [vocab[name]]
    config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<unk>"}
    return data, config


def make_misc(lines):
    """The remaining components: NFKC, Lowercase, Strip, regex Replace; Punctuation, Split
    with invert and merging behaviors, Whitespace; subword prefix/suffix, unknown token
    without fusing; BPE suffix decoder; Bert-style template."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##",
                               end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([
        normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip(),
        normalizers.Replace(Regex(r"\s{2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_previous", invert=False),
        pre_tokenizers.Split(Regex(r"[\p{L}\p{N}]+"), behavior="contiguous", invert=True),
        pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.Whitespace()])
    train(tok, lines, 2500, ["[UNK]", "[CLS]", "[SEP]"], limit_alphabet=80,
          continuing_subword_prefix="##", end_of_word_suffix="</w>")
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    data = json.loads(tok.to_str())
    return data, {}


TOKENIZERS = {"gpt2": make_gpt2, "llama3": make_llama3, "qwen2": make_qwen2,
              "llama2": make_llama2, "mistral": make_mistral, "misc": make_misc}


# --- Test strings ----------------------------------------------------------------------

def random_char(rng):
    """A random code point assigned in this Python's Unicode (not a surrogate or
    private use), mostly from the BMP."""
    import unicodedata
    while True:
        cp = rng.randrange(0x20000) if rng.random() < 0.9 else rng.randrange(0x110000)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        if unicodedata.category(c) not in ("Cn", "Co", "Cs"):
            return c


def make_strings(rng, corpus, specials, count):
    words = corpus.split()
    extra_lines = EXTRA_TRAINING_TEXT.splitlines()
    fixed = ["", " ", "  ", "\n", "\t", " \n ", "hello", " hello", "hello ", "a" * 600,
             "9" * 200, " " * 300, "\n" * 50, "x" + "\u0301" * 20, "\U0001F680" * 10,
             "don't stop", "DON'T STOP", "It'S", "'s", "''", "' s"]
    for s in specials:
        fixed += [s, f" {s} ", f"a{s}b", f"{s}{s}", f"\n{s}\n", s[:-1], s + s[:3],
                  f"  {s}  x", f"x {s}y", f"{s} {s}"]
    strings = list(fixed)
    while len(strings) < count:
        kind = rng.random()
        if kind < 0.25:
            start = rng.randrange(len(corpus))
            strings.append(corpus[start:start + rng.randrange(1, 400)])
            continue
        if kind < 0.3:
            line = rng.choice(extra_lines)
            start = rng.randrange(len(line))
            strings.append(line[start:start + rng.randrange(1, 80)])
            continue
        if kind < 0.33:
            strings.append("".join(random_char(rng) for _ in range(rng.randrange(1, 30))))
            continue
        parts = []
        for _ in range(rng.randrange(1, 25)):
            k = rng.random()
            if k < 0.35:
                w = rng.choice(words)
                parts.append(w.upper() if rng.random() < 0.1 else w)
            elif k < 0.5:
                parts.append(rng.choice(SPACES))
            elif k < 0.58:
                parts.append(rng.choice(PUNCT) * rng.randrange(1, 4))
            elif k < 0.65:
                parts.append(str(rng.randrange(10 ** rng.randrange(1, 12))))
            elif k < 0.72:
                parts.append(rng.choice(WORDS_EXTRA))
            elif k < 0.77:
                parts.append(rng.choice(EMOJI))
            elif k < 0.82:
                parts.append(rng.choice(CODE))
            elif k < 0.88 and specials:
                parts.append(rng.choice(specials))
            elif k < 0.93:
                parts.append(random_char(rng))
            else:
                parts.append(" " + rng.choice(words))
        strings.append("".join(parts))
    return strings


def random_id_sequences(rng, tok, count):
    size = tok.get_vocab_size(with_added_tokens=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    byte_ids = [i for t, i in vocab.items() if t.startswith("<0x") and len(t) == 6]
    sequences = []
    for _ in range(count):
        ids = []
        for _ in range(rng.randrange(1, 24)):
            k = rng.random()
            if k < 0.6 or not byte_ids:
                ids.append(rng.randrange(size))
            else:
                ids.append(rng.choice(byte_ids))
        sequences.append(ids)
    # Byte-level tokens cut inside characters: the last bytes of multi-byte ones.
    return sequences


# --- Sweeps over every code point ------------------------------------------------------

# The code points assigned in this Python's Unicode (3.11: 14.0, the version of PCRE2
# 10.42's tables; `tokenizers` runs Oniguruma with newer ones) in the BMP and the SMP
# (beyond: CJK extensions, all letters alike), and the tags and variation selectors.
def _assigned(cp):
    import unicodedata
    return not 0xD800 <= cp <= 0xDFFF and unicodedata.category(chr(cp)) != "Cn"


SWEEP_CODE_POINTS = [cp for cp in list(range(0x20000)) + list(range(0xE0000, 0xE0200))
                     if _assigned(cp)]

# Classes the regexes of tokenizer.json files use, as Oniguruma reads them.
SWEEP_PATTERNS = [r"\s", r"\S", r"\w", r"\W", r"\d", r"\h", r"\p{L}", r"\p{N}", r"\p{M}",
                  r"\p{P}", r"\p{S}", r"[^\s\p{L}\p{N}]", r"[^\r\n\p{L}\p{N}]", r"(?i:[stremvld])",
                  r"(?i:k)", r"."]


def to_ranges(code_points):
    ranges = []
    for cp in sorted(code_points):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return ranges


def sweeps():
    text = "".join(map(chr, SWEEP_CODE_POINTS))
    out = {"code_points": to_ranges(SWEEP_CODE_POINTS), "classes": [], "predicates": [],
           "normalizers": []}
    for pattern in SWEEP_PATTERNS:
        kept = pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(text)
        non_members = set("".join(piece for piece, _ in kept))
        members = [cp for cp in SWEEP_CODE_POINTS if chr(cp) not in non_members]
        out["classes"].append({"pattern": pattern, "members": to_ranges(members)})
    # Rust's char::is_whitespace and char::is_numeric, through the pre-tokenizers built on
    # them (characters between x's: a numeric one is a piece of its own).
    kept = pre_tokenizers.WhitespaceSplit().pre_tokenize_str("x".join(text))
    non_space = set("".join(piece for piece, _ in kept))
    out["predicates"].append({"name": "is_whitespace", "members": to_ranges(
        cp for cp in SWEEP_CODE_POINTS if chr(cp) not in non_space)})
    pieces = pre_tokenizers.Digits(individual_digits=True).pre_tokenize_str(
        "".join("x" + c for c in text))
    out["predicates"].append({"name": "is_numeric", "members": to_ranges(
        ord(p) for p, _ in pieces if len(p) == 1 and p != "x")})
    # The regex crate's \w (single_word tokens): "a" + c + "a" is one piece for those.
    lines = "".join("a" + c + "a\n" for c in text)
    counts = [0] * len(SWEEP_CODE_POINTS)
    for _, (start, _) in pre_tokenizers.Whitespace().pre_tokenize_str(lines):
        counts[start // 4] += 1
    out["predicates"].append({"name": "regex_word", "members": to_ranges(
        cp for cp, n in zip(SWEEP_CODE_POINTS, counts) if n == 1)})
    # Normalizers one character at a time: where the result differs from the input.
    lines_text = "\n".join(chr(cp) for cp in SWEEP_CODE_POINTS if cp != 0x0A)
    for name, normalizer in [("NFC", normalizers.NFC()), ("NFD", normalizers.NFD()),
                             ("NFKC", normalizers.NFKC()), ("NFKD", normalizers.NFKD()),
                             ("Lowercase", normalizers.Lowercase())]:
        result = normalizer.normalize_str(lines_text).split("\n")
        changed = [[cp, r] for cp, r in zip((c for c in SWEEP_CODE_POINTS if c != 0x0A), result)
                   if r != chr(cp)]
        out["normalizers"].append({"type": name, "changed": changed})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--strings", type=int, default=2000, help="test strings per tokenizer")
    parser.add_argument("--decodes", type=int, default=600, help="random id sequences per tokenizer")
    parser.add_argument("--tokenizers", default=",".join(TOKENIZERS),
                        help="comma-separated subset of " + ",".join(TOKENIZERS))
    parser.add_argument("--sweeps", choices=["yes", "no", "only"], default="yes")
    args = parser.parse_args()
    wanted = [] if args.sweeps == "only" else args.tokenizers.split(",")
    for name in wanted:
        if name not in TOKENIZERS:
            sys.exit(f"unknown tokenizer {name!r}; known: {', '.join(TOKENIZERS)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    corpus = read_corpus(args.corpus)
    lines = training_lines(corpus)
    os.makedirs(args.out, exist_ok=True)
    names = []
    for name in wanted:
        make = TOKENIZERS[name]
        rng = random.Random(f"conveyor-{name}")
        data, config = make(lines)
        directory = os.path.join(args.out, name)
        os.makedirs(directory, exist_ok=True)
        json_path = os.path.join(directory, "tokenizer.json")
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)
        # The reference is what `tokenizers` makes of the file as written.
        tok = Tokenizer.from_file(json_path)
        specials = [t["content"] for t in data["added_tokens"]]
        strings = make_strings(rng, corpus, specials, args.strings)
        plain = tok.encode_batch(strings, add_special_tokens=False)
        framed = tok.encode_batch(strings, add_special_tokens=True)
        plain_ids = [e.ids for e in plain]
        decoded = tok.decode_batch(plain_ids, skip_special_tokens=False)
        sequences = random_id_sequences(rng, tok, args.decodes)
        random_texts = tok.decode_batch(sequences, skip_special_tokens=False)
        cases = {
            "tokenizers_version": tokenizers.__version__,
            "encode": [{"text": s, "ids": p, "ids_special": f.ids, "decoded": d}
                       for s, p, f, d in zip(strings, plain_ids, framed, decoded)],
            "decode": [{"ids": i, "text": t} for i, t in zip(sequences, random_texts)],
        }
        with open(os.path.join(directory, "cases.json"), "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False)
        names.append(name)
    with open(os.path.join(args.out, "names.json"), "w") as f:
        json.dump(names, f)
    if args.sweeps != "no":
        with open(os.path.join(args.out, "sweeps.json"), "w", encoding="utf-8") as f:
            json.dump(sweeps(), f, ensure_ascii=False)


if __name__ == "__main__":
    main()
