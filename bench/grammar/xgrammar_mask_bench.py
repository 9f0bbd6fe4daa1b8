#!/usr/bin/env python3
"""xgrammar's token mask speed on what bench/grammar/mask_bench.cc wrote to DIR: the same
grammars (Conveyor's text, translated as tests/grammar_ref/xgrammar_masks.py does), the
same 128k vocabulary and the same token walks.

  xgrammar_mask_bench.py DIR

Prints one JSON object per schema: per-token fill_next_token_bitmask time (median, p99)
over every state of the walks; compile time (Grammar.from_ebnf and compile_grammar, which
precomputes xgrammar's per-position token masks) on a fresh compiler (cold) and again on the
same one (its grammar cache). One thread for compiling, as mask_bench uses one. Run it with
the xgrammar venv's Python (tests/grammar_ref/requirements.txt).
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "grammar_ref"))
import xgrammar_masks  # noqa: E402


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else 0.0


def main():
    import numpy as np
    directory = sys.argv[1]
    xgr = xgrammar_masks.import_xgrammar()
    with open(os.path.join(directory, "cases.json")) as f:
        spec = json.load(f)
    (vocab_name, vocab_spec), = spec["vocabs"].items()
    vocab = xgrammar_masks.read_vocab(os.path.join(directory, vocab_spec["file"]))
    start = time.perf_counter()
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=len(vocab),
                             stop_token_ids=vocab_spec["eos"])
    vocab_ms = (time.perf_counter() - start) * 1e3
    names = []
    for case in spec["cases"]:
        if case["name"] not in names:
            names.append(case["name"])
    for name in names:
        cases = [c for c in spec["cases"] if c["name"] == name]
        with open(os.path.join(directory, cases[0]["grammar"])) as f:
            text = xgrammar_masks.to_xgrammar_ebnf(f.read())
        compiler = xgr.GrammarCompiler(info, max_threads=1)
        start = time.perf_counter()
        compiled = compiler.compile_grammar(xgr.Grammar.from_ebnf(text, root_rule_name="root"))
        cold_us = (time.perf_counter() - start) * 1e6
        again = []
        for _ in range(10):
            start = time.perf_counter()
            compiler.compile_grammar(xgr.Grammar.from_ebnf(text, root_rule_name="root"))
            again.append((time.perf_counter() - start) * 1e6)
        bitmask = np.zeros((1, (len(vocab) + 31) // 32), dtype=np.int32)
        passes = []
        for _ in range(2):
            times = []
            for case in cases:
                matcher = xgr.GrammarMatcher(compiled)
                tokens = case["tokens"]
                for k in range(len(tokens) + 1):
                    start = time.perf_counter()
                    matcher.fill_next_token_bitmask(bitmask)
                    times.append((time.perf_counter() - start) * 1e6)
                    if k < len(tokens) and not matcher.accept_token(tokens[k]):
                        sys.exit(f"{name}: xgrammar refused token {tokens[k]} after {k}")
            passes.append(times)
        print(json.dumps({
            "engine": "xgrammar", "schema": name, "masks": len(passes[0]),
            "mask_cold_median_us": percentile(passes[0], 0.5),
            "mask_cold_p99_us": percentile(passes[0], 0.99),
            "mask_warm_median_us": percentile(passes[1], 0.5),
            "mask_warm_p99_us": percentile(passes[1], 0.99),
            "mask_warm_max_us": percentile(passes[1], 1.0),
            "compile_cold_us": cold_us, "compile_again_median_us": percentile(again, 0.5),
            "vocab_setup_ms": vocab_ms}))


if __name__ == "__main__":
    main()
