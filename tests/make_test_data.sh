#!/usr/bin/env bash
# Builds the test checkpoints and their reference outputs into OUT_DIR (default
# ./testdata): several `tiny` variants that together cover GQA, tied embeddings,
# Llama-3 and linear RoPE scaling, Qwen2-style qkv bias, f32/f16/bf16 and sharded files,
# each with the independent numpy reference's logits and greedy tokens.
# Usage: tests/make_test_data.sh OUT_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-testdata}"
py=/usr/bin/python3  # Debian's python, which has numpy.
mkdir -p "$out"

make_variant() {
  local name="$1"; shift
  rm -rf "$out/$name"
  "$py" "$here/model_gen/make_test_model.py" --preset tiny --out "$out/$name" "$@" >/dev/null
  local vocab
  vocab=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' \
          "$out/$name/config.json")
  "$py" "$here/reference/make_prompts.py" --vocab-size "$vocab" --out "$out/$name/prompts.json"
  "$py" "$here/reference/llama_ref.py" --model "$out/$name" \
        --prompts "$out/$name/prompts.json" --out "$out/$name/reference.json" --greedy-tokens 32
  echo "test model $name ready"
}

make_variant llama3_gqa --rope-scaling llama3
make_variant tied_mha_bf16_sharded --tie-embeddings --num-kv-heads 4 --dtype bf16 --shards 3 \
  --rope-scaling linear --seed 1
make_variant qwen2_bias_f16 --model-type qwen2 --dtype f16 --seed 2
