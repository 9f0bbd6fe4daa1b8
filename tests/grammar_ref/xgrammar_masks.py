#!/usr/bin/env python3
"""Reference token masks for tests/grammar_ref/mask_reference_test.cc, made with the `xgrammar` package.

The C++ test writes, under DIR, vocabularies, grammars (in Conveyor's grammar form, rule
`root`) and token sequences; this script replays each sequence in xgrammar's
GrammarMatcher and writes the mask before every token and after the last one:

  xgrammar_masks.py DIR

Input, under DIR: cases.json ({"vocabs": {NAME: {"file", "eos"}}, "cases": [{"grammar",
"vocab", "tokens"}]}); each vocabulary file has one line per token id, the token's bytes
in hex (an empty line: the token adds no text, as special tokens do). Output: masks.bin
(the masks of every case in order, ceil(vocab/32) little-endian uint32 words each, bit
id % 32 of word id / 32) and results.json ([{"states", "error"}] per case: how many masks
the case wrote, and why it stopped early, if it did).

Run it with the xgrammar venv's Python (tests/grammar_ref/requirements.txt). xgrammar
imports torch and transformers at module level, though masks need neither (they are filled
through DLPack, here into numpy arrays); where they are absent, stand-ins that carry the
few names xgrammar touches at import are put in their place, so the venv stays small.
"""

import json
import os
import re
import sys
import types


def import_xgrammar():
    """Imports xgrammar, with stand-ins for torch and transformers where they are absent."""
    import numpy as np
    # tvm_ffi probes for torch at import and would take a stand-in for the real thing.
    import tvm_ffi  # noqa: F401
    try:
        import torch  # noqa: F401
    except ImportError:
        torch = types.ModuleType("torch")
        torch.int32, torch.int64, torch.bool = np.int32, np.int64, np.bool_
        torch.tensor = lambda value, dtype=None, **_: np.array(value, dtype=dtype)
        torch.full = lambda shape, value, dtype=None, **_: np.full(shape, value, dtype=dtype)
        torch.__getattr__ = lambda name: type(name, (), {})  # Names used in annotations.
        sys.modules["torch"] = torch
    try:
        import transformers  # noqa: F401
    except ImportError:
        transformers = types.ModuleType("transformers")
        transformers.__getattr__ = lambda name: type(name, (), {})
        sys.modules["transformers"] = transformers
    import xgrammar
    return xgrammar


def to_xgrammar_ebnf(text):
    """Conveyor's grammar form in xgrammar's EBNF. The two differ in one escape: \\xHH is two
    hex digits in ours, as many as follow in xgrammar's ("\\x41b" is U+041B there), so it
    becomes \\u00HH (exactly four in both). Everything else reads alike: rule names with '-',
    strings, classes and their escapes, `{m,n}`, `#` comments."""
    return re.sub(r"\\(\\|x([0-9a-fA-F]{2}))",
                  lambda m: "\\u00" + m.group(2) if m.group(2) else m.group(0), text)


def read_vocab(path):
    with open(path) as f:
        return [bytes.fromhex(line.strip()) for line in f.read().split("\n")[:-1]]


class Reference:
    """xgrammar's compiler per vocabulary, over the vocabularies of a test directory."""

    def __init__(self, xgr, directory, spec):
        self.xgr = xgr
        self.compilers = {}
        self.sizes = {}
        for name, vocab_spec in spec["vocabs"].items():
            vocab = read_vocab(os.path.join(directory, vocab_spec["file"]))
            info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=len(vocab),
                                     stop_token_ids=vocab_spec["eos"])
            self.compilers[name] = xgr.GrammarCompiler(info, max_threads=1)
            self.sizes[name] = len(vocab)

    def compile(self, grammar_text, vocab):
        grammar = self.xgr.Grammar.from_ebnf(to_xgrammar_ebnf(grammar_text),
                                             root_rule_name="root")
        return self.compilers[vocab].compile_grammar(grammar)


def main():
    import numpy as np
    directory = sys.argv[1]
    xgr = import_xgrammar()
    with open(os.path.join(directory, "cases.json")) as f:
        spec = json.load(f)
    reference = Reference(xgr, directory, spec)
    results = []
    with open(os.path.join(directory, "masks.bin"), "wb") as out:
        for case in spec["cases"]:
            size = reference.sizes[case["vocab"]]
            words = (size + 31) // 32
            states = 0
            error = ""
            try:
                with open(os.path.join(directory, case["grammar"])) as f:
                    compiled = reference.compile(f.read(), case["vocab"])
                matcher = xgr.GrammarMatcher(compiled)
                bitmask = np.zeros((1, words), dtype=np.int32)
                tokens = case["tokens"]
                for k in range(len(tokens) + 1):
                    bitmask.fill(0)
                    matcher.fill_next_token_bitmask(bitmask)
                    out.write(bitmask.astype("<i4").tobytes())
                    states += 1
                    if k < len(tokens) and not matcher.accept_token(tokens[k]):
                        error = f"xgrammar refused token {tokens[k]} after {k} tokens"
                        break
            except Exception as e:  # A grammar xgrammar cannot read: said, not fatal.
                error = f"{type(e).__name__}: {e}"
            results.append({"states": states, "error": error})
    with open(os.path.join(directory, "results.json"), "w") as f:
        json.dump(results, f)
    from importlib.metadata import version
    print(f"xgrammar {version('xgrammar')}: {sum(r['states'] for r in results)} "
          f"masks over {len(results)} cases")


if __name__ == "__main__":
    main()
