#!/usr/bin/python3
"""Writes a fixed, seeded set of test prompts (token ids) as a JSON list of lists.

The prompts feed tests/reference/llama_ref.py and the matching Conveyor tests. Each
prompt starts with BOS (id 1) followed by ids drawn uniformly from [3, vocab_size),
i.e. excluding <unk>=0, <s>=1 and </s>=2 of the test tokenizer. Default lengths are
1, 7, 23 and 40 tokens; the same arguments always give the same file.

Example:
  /usr/bin/python3 tests/reference/make_prompts.py --vocab-size 512 --out prompts.json
"""

import argparse
import json

import numpy as np

BOS_ID = 1
FIRST_ORDINARY_ID = 3


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--out", required=True, help="output JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lengths", type=int, nargs="+", default=[1, 7, 23, 40],
                   help="prompt lengths in tokens, BOS included (default 1 7 23 40)")
    args = p.parse_args()
    if args.vocab_size <= FIRST_ORDINARY_ID:
        p.error(f"--vocab-size must exceed {FIRST_ORDINARY_ID}")
    if min(args.lengths) < 1:
        p.error("--lengths must be >= 1")

    rng = np.random.default_rng(args.seed)
    prompts = [[BOS_ID] + rng.integers(FIRST_ORDINARY_ID, args.vocab_size,
                                       n - 1).tolist() for n in args.lengths]
    with open(args.out, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(x) for x in prompts) + "\n]\n")


if __name__ == "__main__":
    main()
