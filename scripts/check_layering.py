#!/usr/bin/env python3
"""Keeps the layering of docs/design.md true: which part of the tree may include which.

  scripts/check_layering.py          # exit 1, naming each include that breaks a rule

A part is a top-level folder (common, checkpoint, text, rpc, kernels, model, worker,
scheduler); generated protobuf headers (*.pb.h) count as the part `proto`. Each product
part may include only the parts listed for it below; tests beside the code (*_test.cc,
*_test_util.h) may also use tests/ and testing/ (the support tests and benches share).
tests/, testing/, bench/ and the rest are not checked. Edges that a planned step removes are listed, file by file, as DEBT: a
new include of the same kind fails, and a debt entry that no longer occurs fails too, so
the list only shrinks.
"""

import os
import re
import subprocess
import sys

# Part -> the parts it may include. Depend downward: the processes (worker, scheduler) on
# the runtime and helpers, the model runtime on kernels and checkpoints, nothing on the
# processes.
ALLOWED = {
    "common": set(),
    "checkpoint": {"common"},
    # A GGUF file carries its tokenizer and chat template (issue K): text/ reads them
    # with checkpoint/'s GGUF parser.
    "text": {"common", "checkpoint"},
    # Structured output's grammar engine: the scheduler compiles schemas with it, the
    # worker matches tokens with it; so it may not use text/ (the worker never tokenizes).
    "grammar": {"common"},
    "rpc": {"common", "proto"},
    "kernels": {"common"},
    "model": {"common", "checkpoint", "kernels"},
    "worker": {"common", "checkpoint", "model", "grammar", "rpc", "proto"},
    "scheduler": {"common", "text", "grammar", "rpc", "proto"},
}
PARTS = set(ALLOWED) | {"tests", "testing", "bench", "proto"}

# (file, part it includes): edges a planned step removes. None left.
DEBT = set()

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def included_part(path):
    if path.endswith(".pb.h"):
        return "proto"
    head = path.split("/", 1)[0]
    return head if "/" in path and head in PARTS else None


def is_test_code(path):
    name = os.path.basename(path)
    return re.search(r"_test(_util)?\.(cc|h)$", name) is not None


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = subprocess.run(["git", "-C", root, "ls-files", "*.h", "*.cc", "*.cu", "*.cuh"],
                           capture_output=True, text=True, check=True).stdout.split()
    errors = []
    debt_seen = set()
    for f in files:
        part = f.split("/", 1)[0]
        if part not in ALLOWED:
            continue
        allowed = ALLOWED[part] | ({"tests", "testing"} if is_test_code(f) else set())
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as source:
            for number, line in enumerate(source, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = included_part(m.group(1))
                if target is None or target == part or target in allowed:
                    continue
                if (f, target) in DEBT:
                    debt_seen.add((f, target))
                    continue
                errors.append(f"{f}:{number}: {part}/ may not include {m.group(1)} "
                              f"({part} may use: {', '.join(sorted(allowed)) or 'nothing'})")
    for f, target in sorted(DEBT - debt_seen):
        errors.append(f"{f}: no longer includes {target}/: remove it from DEBT in "
                      "scripts/check_layering.py")
    for e in errors:
        print(e)
    print(f"check_layering: {len(files)} files, {len(errors)} problem(s), "
          f"{len(debt_seen)} known debt edge(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
