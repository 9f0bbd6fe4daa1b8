#!/usr/bin/env python3
"""Writes prompts for the demo model as token ids, one prompt a line (conveyor-bench's
--prompts_file), from the chapters demo/train.py holds out (text the model never saw).

  grounded: a passage of verses, a few other verses, then the passage's first words again:
            the answer that continues it copies the passage (what quoting, editing and
            extracting ask of a model; the demo model is not instruction-tuned, so the
            request is the layout itself). Speculation's proposers find the drafts there.
  free:     the first verses of a chapter, nothing to copy: free generation on text.

Usage: make_grounded_prompts.py --kind grounded|free --out FILE [--model-dir demo/model]
       [--count 32] [--passage-tokens 160] [--cue-words 6] [--seed 0]
Needs `tokenizers` (HF) and the `bible` program (Debian package bible-kjv).
"""

import argparse
import os
import random
import sys

from tokenizers import Tokenizer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "demo"))
from kjv import read_chapters, split_held_out  # noqa: E402


def verses_up_to(tok, verses, budget):
    """The leading verses whose tokens fit in `budget` (at least one)."""
    taken, used = [], 0
    for verse in verses:
        n = len(tok.encode(verse, add_special_tokens=False).ids) + 1
        if taken and used + n > budget:
            break
        taken.append(verse)
        used += n
    return taken


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=["grounded", "free"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model-dir", default="demo/model")
    p.add_argument("--count", type=int, default=32)
    p.add_argument("--passage-tokens", type=int, default=160)
    p.add_argument("--cue-words", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
    _, held = split_held_out(read_chapters())
    rng = random.Random(args.seed)
    lines = []
    for _ in range(args.count):
        chapter = rng.choice(held).split("\n")
        if args.kind == "free":
            text = "\n".join(verses_up_to(tok, chapter, args.passage_tokens)) + "\n"
        else:
            start = rng.randrange(max(1, len(chapter) - 4))
            passage = verses_up_to(tok, chapter[start:], args.passage_tokens)
            other = rng.choice(held).split("\n")
            gap = verses_up_to(tok, other[rng.randrange(len(other)):], 40)
            cue = " ".join(passage[0].split(" ")[:args.cue_words])
            text = "\n".join(passage + gap + [cue])
        lines.append(" ".join(str(i) for i in tok.encode(text).ids))  # With <s>.
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    lengths = sorted(len(line.split()) for line in lines)
    print(f"wrote {len(lines)} {args.kind} prompts to {args.out}: "
          f"{lengths[0]}-{lengths[-1]} tokens (median {lengths[len(lengths) // 2]})")


if __name__ == "__main__":
    main()
