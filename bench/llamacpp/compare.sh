#!/usr/bin/env bash
# Conveyor against llama.cpp's llama-server on the same GGUF files (issue 34, deliverable 4):
# for each file, llama-server and then Conveyor (scheduler + one worker, once per
# --cpu_weight_dtype in $STORAGES) serve it in turn, never at once; each gets a warm-up
# request, then streamed /v1/completions waves at 1, 8 and 32 concurrent clients
# (stream_load.py); then llama-perplexity and gguf_perplexity score the held-out text.
# Prints one table per file and writes everything under $OUT. README.md says how to build
# the reference and what the numbers mean.
#
#   bench/llamacpp/compare.sh FILE.gguf [FILE.gguf ...]
#   bench/llamacpp/compare.sh --make-models    # writes $MODELS/{q4_k_m,q8_0}.gguf, then runs them
#
# Environment (defaults in brackets):
#   LLAMA_BUILD [/opt/llama-ref/build]   llama.cpp build (bin/llama-server, bin/llama-perplexity)
#   CONVEYOR_BUILD [<repo>/build]        Conveyor build (worker, scheduler, bench/gguf_perplexity)
#   THREADS [2] CONCURRENCY ["1 8 32"] ROUNDS [2] PROMPT_TOKENS [128] MAX_TOKENS [128]
#   STORAGES ["auto gguf"]   Conveyor's --cpu_weight_dtype values to run
#   PPL_CTX [256] PPL ["1"]  perplexity chunk size; PPL=0 skips perplexity
#   OUT [/tmp/llama-bench/run-<time>]   MODELS [/tmp/llama-bench]
#   REPEAT [1]       run every engine this many times, alternating (table.py keeps each
#                    engine's best wave: on a shared machine, the least disturbed one)
#   WAIT_QUIET [0]   before each engine, wait (up to 30 min) until the CPUs have been
#                    >= 90% idle for this many seconds (a machine shared with builds)
#   PYTHON [/opt/conveyor-test-venv/bin/python] (needs numpy, gguf, tokenizers only for
#   --make-models; the load client needs the standard library only)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
LLAMA_BUILD="${LLAMA_BUILD:-/opt/llama-ref/build}"
CONVEYOR_BUILD="${CONVEYOR_BUILD:-$repo/build}"
THREADS="${THREADS:-2}"
CONCURRENCY="${CONCURRENCY:-1 8 32}"
ROUNDS="${ROUNDS:-2}"
PROMPT_TOKENS="${PROMPT_TOKENS:-128}"
MAX_TOKENS="${MAX_TOKENS:-128}"
STORAGES="${STORAGES:-auto gguf}"
PPL_CTX="${PPL_CTX:-256}"
PPL="${PPL:-1}"
MODELS="${MODELS:-/tmp/llama-bench}"
OUT="${OUT:-/tmp/llama-bench/run-$(date +%Y%m%d-%H%M%S)}"
PYTHON="${PYTHON:-/opt/conveyor-test-venv/bin/python}"
WAIT_QUIET="${WAIT_QUIET:-0}"
REPEAT="${REPEAT:-1}"
TEXT="$here/heldout.txt"

if [[ "${1:-}" == "--make-models" ]]; then
  mkdir -p "$MODELS"
  for type in q4_k_m q8_0; do
    [[ -f "$MODELS/$type.gguf" ]] && continue
    "$PYTHON" "$repo/tests/gguf_ref/make_quant_gguf.py" --out "$MODELS/$type.gguf" --type "$type" \
      --hidden 2048 --ffn 5632 --layers 4 --heads 16 --kv-heads 4 --vocab 4096 \
      --tokenizer-corpus "$repo/tests/model_gen/corpus.txt"
  done
  set -- "$MODELS/q4_k_m.gguf" "$MODELS/q8_0.gguf"
fi
if [[ $# -eq 0 ]]; then
  sed -n '2,22p' "${BASH_SOURCE[0]}" >&2
  exit 2
fi
for bin in "$LLAMA_BUILD/bin/llama-server" "$CONVEYOR_BUILD/worker/conveyor-worker" \
  "$CONVEYOR_BUILD/scheduler/conveyor-scheduler"; do
  [[ -x "$bin" ]] || { echo "missing $bin (README.md: building)" >&2; exit 1; }
done
mkdir -p "$OUT"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT

# Waits until $1 answers 200 (up to $2 seconds).
wait_http() {
  local url="$1" limit="$2" i
  for ((i = 0; i < limit * 5; i++)); do
    if python3 -c "import sys,urllib.request; sys.exit(urllib.request.urlopen('$url', timeout=2).status != 200)" 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  echo "timed out waiting for $url" >&2
  return 1
}

compiling() { (pgrep -fa 'ninja|cc1plus|clang|/ld ' || true) | grep -v pgrep | wc -l; }

# Percent of all CPU time that was busy over the next second (/proc/stat).
cpu_busy_1s() {
  local _ u n s i w q sq st t1 i1
  read -r _ u n s i w q sq st _ </proc/stat
  t1=$((u + n + s + i + w + q + sq + st)) i1=$((i + w))
  sleep 1
  read -r _ u n s i w q sq st _ </proc/stat
  t1=$((u + n + s + i + w + q + sq + st - t1)) i1=$((i + w - i1))
  echo $((t1 > 0 ? 100 * (t1 - i1) / t1 : 0))
}

# With WAIT_QUIET=N: returns once the CPUs have been at least 90% idle for N seconds in a
# row (compiles, tests, fuzzers: anything), or after 30 min.
wait_quiet() {
  [[ "$WAIT_QUIET" -gt 0 ]] || return 0
  local quiet=0 waited=0
  while ((quiet < WAIT_QUIET && waited < 1800)); do
    if (($(cpu_busy_1s) <= 10)); then quiet=$((quiet + 1)); else quiet=0; fi
    waited=$((waited + 1))
  done
  echo "$(date '+%H:%M:%S') waited ${waited}s for quiet (idle for ${quiet}s)" | tee -a "$OUT/load.txt"
}

load_note() {
  echo "$(date '+%H:%M:%S') uptime:$(uptime | sed 's/.*load average/ load average/')"
  echo "  compiling: $(compiling) processes; CPU busy over 1 s: $(cpu_busy_1s)%"
}

# Runs the waves against $1 (base URL), engine label $2, file label $3.
waves() {
  local url="$1" engine="$2" file="$3" c
  python3 "$here/stream_load.py" --base-url "$url" --warmup --prompt-tokens "$PROMPT_TOKENS"
  for c in $CONCURRENCY; do
    python3 "$here/stream_load.py" --base-url "$url" --concurrency "$c" --rounds "$ROUNDS" \
      --prompt-tokens "$PROMPT_TOKENS" --max-tokens "$MAX_TOKENS" |
      python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r.update(engine='$engine', file='$file'); print(json.dumps(r))" |
      tee -a "$OUT/results.jsonl"
  done
}

run_llama() {
  local model="$1" label="$2" port
  port="$(free_port)"
  # Every slot must hold a prompt and its output (+ BOS), with room to spare.
  local ctx=$((32 * (PROMPT_TOKENS + MAX_TOKENS + 64)))
  wait_quiet
  "$LLAMA_BUILD/bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -np 32 -c "$ctx" \
    -t "$THREADS" -tb "$THREADS" --no-webui >"$OUT/llama-server-$label.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$port/health" 120
  waves "http://127.0.0.1:$port" llama.cpp "$label"
  stop_all
}

run_conveyor() {
  local model="$1" label="$2" storage="$3" wport hport
  wport="$(free_port)"
  hport="$(free_port)"
  wait_quiet
  "$CONVEYOR_BUILD/worker/conveyor-worker" --port="$wport" --metrics_port=0 --threads="$THREADS" \
    --cpu_weight_dtype="$storage" >"$OUT/conveyor-worker-$label-$storage.log" 2>&1 &
  pids+=($!)
  "$CONVEYOR_BUILD/scheduler/conveyor-scheduler" --model="$model" --workers="127.0.0.1:$wport" \
    --port=0 --metrics_port=0 --http_port="$hport" --kv_cache_bytes=$((512 << 20)) \
    >"$OUT/conveyor-scheduler-$label-$storage.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$hport/health" 180
  waves "http://127.0.0.1:$hport" "conveyor-$storage" "$label"
  stop_all
}

# llama-perplexity and gguf_perplexity on the held-out text, same chunking, and on the
# same token ids (llama-tokenize's, when it is built) to take the tokenizers out.
run_ppl() {
  local model="$1" label="$2" storage
  [[ "$PPL" == "1" ]] || return 0
  "$LLAMA_BUILD/bin/llama-perplexity" -m "$model" -f "$TEXT" -c "$PPL_CTX" -b "$PPL_CTX" \
    -t "$THREADS" >"$OUT/llama-perplexity-$label.log" 2>&1
  local llama_ppl
  llama_ppl="$(grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$OUT/llama-perplexity-$label.log")"
  echo "{\"file\": \"$label\", \"engine\": \"llama.cpp\", \"ppl\": \"${llama_ppl#Final estimate: PPL = }\"}" |
    tee -a "$OUT/perplexity.jsonl"
  local ids_flag=()
  if [[ -x "$LLAMA_BUILD/bin/llama-tokenize" ]]; then
    "$LLAMA_BUILD/bin/llama-tokenize" -m "$model" -f "$TEXT" --ids --log-disable \
      >"$OUT/llama-ids-$label.txt" 2>/dev/null
    ids_flag=(--tokens_file="$OUT/llama-ids-$label.txt")
  fi
  for storage in $STORAGES f32; do
    "$CONVEYOR_BUILD/bench/gguf_perplexity" --model="$model" --text="$TEXT" --ctx="$PPL_CTX" \
      --threads="$THREADS" --cpu_weight_dtype="$storage" --dump_tokens="$OUT/conveyor-ids-$label.txt" \
      >"$OUT/conveyor-perplexity-$label-$storage.log" 2>&1
    local ppl same=""
    ppl="$(grep -o 'PPL = [0-9.]* +/- [0-9.]*' "$OUT/conveyor-perplexity-$label-$storage.log")"
    if [[ ${#ids_flag[@]} -gt 0 ]]; then
      "$CONVEYOR_BUILD/bench/gguf_perplexity" --model="$model" --ctx="$PPL_CTX" --threads="$THREADS" \
        --cpu_weight_dtype="$storage" "${ids_flag[@]}" \
        >"$OUT/conveyor-perplexity-$label-$storage-llama-ids.log" 2>&1
      same="$(grep -o 'PPL = [0-9.]* +/- [0-9.]*' "$OUT/conveyor-perplexity-$label-$storage-llama-ids.log")"
    fi
    echo "{\"file\": \"$label\", \"engine\": \"conveyor-$storage\", \"ppl\": \"${ppl#PPL = }\", \"ppl_on_llama_ids\": \"${same#PPL = }\"}" |
      tee -a "$OUT/perplexity.jsonl"
  done
}

{
  echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), threads $THREADS"
  echo "llama.cpp: $("$LLAMA_BUILD/bin/llama-server" --version 2>&1 | grep -m1 version)"
  # A copied build (binaries taken out of a tree that keeps changing) says where it came from.
  src="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$CONVEYOR_BUILD/CMakeCache.txt" 2>/dev/null || true)"
  if [[ -f "$CONVEYOR_BUILD/SNAPSHOT.txt" ]]; then
    sed 's/^/conveyor snapshot: /' "$CONVEYOR_BUILD/SNAPSHOT.txt"
  elif [[ -n "$src" ]] && git -C "$src" rev-parse HEAD >/dev/null 2>&1; then
    echo "conveyor: $src at $(git -C "$src" log -1 --format='%h %s')"
    echo "  uncommitted: $(git -C "$src" status --short --untracked-files=no | tr '\n' ' ')"
  fi
  load_note
} | tee -a "$OUT/load.txt"
for model in "$@"; do
  label="$(basename "$model" .gguf)"
  for ((rep = 1; rep <= REPEAT; rep++)); do
    run_llama "$model" "$label"
    for storage in $STORAGES; do run_conveyor "$model" "$label" "$storage"; done
  done
  run_ppl "$model" "$label"
  load_note | tee -a "$OUT/load.txt"
done
python3 "$here/table.py" "$OUT" | tee "$OUT/table.md"
echo "results: $OUT"
