#!/usr/bin/env python3
"""Markdown tables of a compare.sh run: results.jsonl (one line per engine, file and
concurrency; several with REPEAT, of which the table shows the highest tok/s, with that
wave's TTFT and TPOT) and perplexity.jsonl, from the run directory given.

  table.py RUN_DIR
"""
import json
import os
import sys


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    run = sys.argv[1]
    rows = read_lines(os.path.join(run, "results.jsonl"))
    files = list(dict.fromkeys(r["file"] for r in rows))
    for file in files:
        mine = [r for r in rows if r["file"] == file]
        engines = list(dict.fromkeys(r["engine"] for r in mine))
        conveyors = [e for e in engines if e != "llama.cpp"]
        by, waves = {}, {}
        for r in mine:
            key = (r["engine"], r["concurrency"])
            waves[key] = waves.get(key, 0) + 1
            if key not in by or r["tok_s"] > by[key]["tok_s"]:
                by[key] = r
        print(f"\n### {file}\n")
        if max(waves.values()) > 1:
            print(f"Best of {max(waves.values())} waves per cell.\n")
        head = ["streams", "llama.cpp tok/s"]
        for e in conveyors:
            head += [f"{e} tok/s", "÷ llama.cpp"]
        head += ["TTFT p50 ms (" + " / ".join(["llama.cpp"] + conveyors) + ")",
                 "TPOT p50 ms (" + " / ".join(["llama.cpp"] + conveyors) + ")"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for c in sorted({r["concurrency"] for r in mine}):
            base = by.get(("llama.cpp", c))
            cells = [str(c), f"{base['tok_s']:.1f}" if base else "-"]
            for e in conveyors:
                r = by.get((e, c))
                cells.append(f"{r['tok_s']:.1f}" if r else "-")
                cells.append(f"{r['tok_s'] / base['tok_s']:.2f}x" if r and base else "-")
            for key in ("ttft_p50_ms", "tpot_p50_ms"):
                vals = [by.get((e, c)) for e in ["llama.cpp"] + conveyors]
                cells.append(" / ".join(f"{v[key]:g}" if v else "-" for v in vals))
            print("| " + " | ".join(cells) + " |")
    ppl = read_lines(os.path.join(run, "perplexity.jsonl"))
    if ppl:
        print("\n### Perplexity (held-out text)\n")
        print("| file | engine | PPL on its own tokens | PPL on llama.cpp's token ids |")
        print("|---|---|---|---|")
        for p in ppl:
            print(f"| {p['file']} | {p['engine']} | {p['ppl']} | {p.get('ppl_on_llama_ids') or '-'} |")


if __name__ == "__main__":
    main()
