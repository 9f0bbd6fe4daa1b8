#!/usr/bin/env bash
# Encode throughput of Conveyor's tokenizer.json implementation against HF's `tokenizers`
# (the PyPI package in the test venv), same tokenizers, same texts, one thread each.
#
#   bench/run_tokenizer_bench.sh [BUILD_DIR]     (default: build)
#   env: CONVEYOR_TEST_VENV (default /opt/conveyor-test-venv), MIN_SECONDS (default 1)
#
# The tokenizers are the five of tests/tokenizer_ref/make_tokenizers.py (GPT-2, Llama 3,
# Qwen2, Llama 2 and Mistral style, trained on tests/model_gen/corpus.txt: small
# vocabularies, so more merges per word than a 128k-entry one). Two sets of texts: the
# corpus's paragraphs (English prose) and the generator's mixed test strings (code,
# CJK, emoji, whitespace runs, digits). `tokenizers` runs with RAYON_NUM_THREADS=1 and
# TOKENIZERS_PARALLELISM=false, measured both as encode() per string and as
# encode_batch() over all of them; Conveyor calls Tokenizer::Encode per string. Every
# figure is after one warm-up pass (both sides cache words). The ids of both are checked
# to be identical.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
venv="${CONVEYOR_TEST_VENV:-/opt/conveyor-test-venv}"
python="$venv/bin/python"
min_seconds="${MIN_SECONDS:-1}"
[ -x "$python" ] || { echo "no $python; run scripts/install-deps.sh" >&2; exit 1; }
ninja -C "$build" tokenizer_bench >/dev/null
bench="$build/bench/tokenizer_bench"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" "$root/tests/tokenizer_ref/make_tokenizers.py" --corpus "$root/tests/model_gen/corpus.txt" \
  --out "$work" --tokenizers gpt2,llama3,qwen2,llama2,mistral --strings 3000 --decodes 1 --sweeps no

# The two text sets.
"$python" - "$root/tests/model_gen/corpus.txt" "$work" <<'EOF'
import json, sys
corpus, work = sys.argv[1], sys.argv[2]
paragraphs = [p for p in open(corpus, encoding="utf-8").read().split("\n\n") if p.strip()]
mixed = [c["text"] for c in json.load(open(f"{work}/gpt2/cases.json", encoding="utf-8"))["encode"]]
json.dump(paragraphs, open(f"{work}/prose.json", "w"), ensure_ascii=False)
json.dump(mixed, open(f"{work}/mixed.json", "w"), ensure_ascii=False)
EOF

# HF tokenizers on one thread: encode() per string, encode_batch(), decode_batch().
hf_bench() {
  RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$python" - "$1" "$2" "$min_seconds" "$3" <<'EOF'
import json, sys, time
from tokenizers import Tokenizer
path, texts_path, min_seconds, ids_out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
tok = Tokenizer.from_file(path)
texts = json.load(open(texts_path, encoding="utf-8"))
size = sum(len(t.encode("utf-8")) for t in texts)

def per_pass(run):
    run()  # Warm-up.
    passes, start = 0, time.perf_counter()
    while True:
        run()
        passes += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / passes

one = per_pass(lambda: [tok.encode(t, add_special_tokens=False) for t in texts])
batch = per_pass(lambda: tok.encode_batch(texts, add_special_tokens=False))
ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
decoded = sum(len(t.encode("utf-8")) for t in tok.decode_batch(ids, skip_special_tokens=False))
dec = per_pass(lambda: tok.decode_batch(ids, skip_special_tokens=False))
json.dump(ids, open(ids_out, "w"))
print(json.dumps({"encode_mb_per_s": size / one / 1e6, "encode_batch_mb_per_s": size / batch / 1e6,
                  "decode_batch_mb_per_s": decoded / dec / 1e6}))
EOF
}

printf '%-8s %-6s %14s %16s %16s %14s %14s  %s\n' tokenizer texts "conveyor MB/s" "hf encode MB/s" \
  "hf batch MB/s" "conveyor dec" "hf dec batch" ids
for name in gpt2 llama3 qwen2 llama2 mistral; do
  for texts in prose mixed; do
    ours="$("$bench" --tokenizer="$work/$name" --texts="$work/$texts.json" \
      --min_seconds="$min_seconds" --ids_out="$work/ours.json")"
    theirs="$(hf_bench "$work/$name/tokenizer.json" "$work/$texts.json" "$work/theirs.json")"
    "$python" - "$name" "$texts" "$ours" "$theirs" "$work/ours.json" "$work/theirs.json" <<'EOF'
import json, sys
name, texts, ours, theirs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
same = json.load(open(sys.argv[5])) == json.load(open(sys.argv[6]))
print(f"{name:<8} {texts:<6} {ours['encode_mb_per_s']:14.2f} {theirs['encode_mb_per_s']:16.2f} "
      f"{theirs['encode_batch_mb_per_s']:16.2f} {ours['decode_mb_per_s']:14.1f} "
      f"{theirs['decode_batch_mb_per_s']:14.1f}  {'identical' if same else 'DIFFERENT'}")
EOF
  done
done
grep -m1 "model name" /proc/cpuinfo | sed 's/^/cpu: /'
