"""The demo model's text: the King James Bible, chapter by chapter, and which chapters are
held out (never trained on). Shared by demo/train.py and the benchmarks that prompt the
demo model with text it has not seen (bench/make_grounded_prompts.py). Needs the `bible`
program (Debian package bible-kjv, demo/README.md)."""

import re
import subprocess

HELD_OUT_EVERY = 20  # Chapter k is held out when k % HELD_OUT_EVERY == HELD_OUT_EVERY // 2.


def read_chapters():
    """The KJV as a list of chapters, each the chapter's verses joined by newlines.

    `bible -f` prints one verse a line, prefixed by its reference ("Ge1:1 In the ...",
    "1Sa3:4 That ..."); a new chapter starts where the book or chapter number changes."""
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, check=True).stdout
    chapters, current, verses = [], None, []
    for line in out.splitlines():
        m = re.fullmatch(r"(\d?[A-Za-z]+)(\d+):\d+ (.+)", line)
        if m is None:
            raise ValueError(f"unexpected line from bible: {line!r}")
        if (m[1], m[2]) != current and verses:
            chapters.append("\n".join(verses))
            verses = []
        current = (m[1], m[2])
        verses.append(m[3].strip())
    chapters.append("\n".join(verses))
    return chapters



def split_held_out(chapters):
    """(training chapters, held-out chapters): every 20th chapter, 5 %, is held out."""
    held = [c for k, c in enumerate(chapters) if k % HELD_OUT_EVERY == HELD_OUT_EVERY // 2]
    kept = [c for k, c in enumerate(chapters) if k % HELD_OUT_EVERY != HELD_OUT_EVERY // 2]
    return kept, held
