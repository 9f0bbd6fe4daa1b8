#!/usr/bin/env bash
# Builds the test checkpoints and their reference outputs into OUT_DIR (default
# ./testdata): several `tiny` variants that together cover GQA, tied embeddings,
# Llama-3, linear and YaRN RoPE scaling, Qwen2-style qkv bias, Qwen3 q/k norms with
# q/k/v/o biases and head_dim != hidden / heads, Qwen3-MoE (dense and sparse layers
# chosen by mlp_only_layers or decoder_sparse_step; norm_topk_prob off and on), Mixtral,
# f32/f16/bf16 and sharded files, each with the independent numpy reference's logits and
# greedy tokens. tests/reference/hf_fixtures/ holds Hugging Face's logits for the same
# checkpoints (tests/reference/README.md).
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
# The MoE variants' seeds were picked (from 3..22) for their wide routing margins: no
# token's k-th and (k+1)-th router logits within 4e-3 of each other (reference.json's
# *routing_logit_margin), so float32 picks the same experts as float64.
# head_dim 32 with hidden 64 and 4 heads; attention_bias (q, k, v and o).
make_variant qwen3_dense_yarn --model-type qwen3 --head-dim 32 --qkv-bias --rope-scaling yarn \
  --seed 3
# 3 layers: 0 and 2 sparse (8 experts, top 2, raw softmax weights), 1 dense.
make_variant qwen3_moe --model-type qwen3_moe --head-dim 32 --num-layers 3 --num-experts 8 \
  --experts-per-tok 2 --moe-intermediate-size 32 --mlp-only-layers 1 --seed 10
# decoder_sparse_step 2: only layer 1 sparse (top 3, renormalised); 1 kv head.
make_variant qwen3_moe_norm_bf16 --model-type qwen3_moe --head-dim 32 --num-layers 3 \
  --num-kv-heads 1 --num-experts 8 --experts-per-tok 3 --moe-intermediate-size 32 \
  --decoder-sparse-step 2 --norm-topk-prob --dtype bf16 --seed 16
make_variant mixtral_moe_tied --model-type mixtral --tie-embeddings --num-experts 8 \
  --experts-per-tok 2 --intermediate-size 48 --seed 13
