#!/usr/bin/env python3
"""Checks that the repository paths named in comments and docs exist.

A comment that says "see worker/engine.cc" after that file moved sends the next reader
nowhere. This scans the tracked sources, docs and scripts for words that start with one
of the top-level folders (scheduler/, text/, docs/, ...) and reports each that names no
file or folder. `name.{h,cc}` and `name.*` forms are expanded. Recorded results under
bench/results/ are history and are not checked.

  scripts/check_paths.py      exit 1 on any stale path
"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = ("proto", "scheduler", "worker", "model", "kernels", "common", "deploy", "tests", "bench",
       "text", "rpc", "checkpoint", "docs", "scripts")
PATH = re.compile(r"(?<![\w./$-])((?:%s)/[A-Za-z0-9_.*{},/-]*[A-Za-z0-9_*}/])" % "|".join(TOP))
SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".md", ".py", ".sh", ".txt", ".proto", ".yaml", ".yml",
            ".json", ".toml", "")
# Recorded results are history; this file names stale paths as examples.
SKIP_PREFIXES = ("bench/results/", "scripts/check_paths.py")


def candidates(path):
    """The concrete paths a mention stands for (brace forms expanded)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    out = []
    for alt in m.group(1).split(","):
        out += candidates(path[:m.start()] + alt + path[m.end():])
    return out


def exists(path, base):
    """Whether `path` names something from the top, or from the mentioning file's folder
    `base` or one above it (tests/CMakeLists.txt says worker/tp_test.cc)."""
    path = path.rstrip("/")
    while True:
        full = os.path.join(ROOT, base, path)
        if glob.glob(full) if "*" in path else os.path.exists(full):
            return True
        if not base:
            return False
        base = os.path.dirname(base)


def main():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    problems = []
    for name in files:
        if name.startswith(SKIP_PREFIXES) or not name.endswith(SUFFIXES):
            continue
        if os.path.splitext(name)[1] == "" and not name.startswith("scripts/") and "/" in name:
            continue
        try:
            text = open(os.path.join(ROOT, name), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in PATH.finditer(line):
                mention = m.group(1).rstrip(".,")
                # Only mentions that look like a file or a folder of this repository.
                last = mention.rstrip("/").split("/")[-1]
                if "." not in last and not mention.endswith("/") and "{" not in last:
                    continue
                base = os.path.dirname(name)
                if not all(exists(p, base) for p in candidates(mention)):
                    problems.append(f"{name}:{lineno}: {mention}")
    for p in problems:
        print(p)
    print(f"check_paths: {len(problems)} stale path(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
