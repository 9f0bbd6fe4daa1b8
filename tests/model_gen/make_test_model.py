#!/usr/bin/python3
"""Writes a random-weight Llama-family checkpoint in Hugging Face layout, for tests.

Model types: llama, mistral, qwen2 (dense; differ in which biases exist), qwen3 (adds
per-head q/k RMSNorm), qwen3_moe (qwen3 attention; sparse MoE MLPs on the layers that
decoder_sparse_step and mlp_only_layers select, dense MLPs on the others) and mixtral
(every layer a sparse MoE under `block_sparse_moe`, experts w1/w3/w2).

The output directory gets `config.json`, the weights as safetensors (one file, or
`--shards N` files plus `model.safetensors.index.json`) and a sentencepiece BPE
`tokenizer.model` trained by `spm_train` on `corpus.txt` next to this script. The
config's vocab_size is the tokenizer's real piece count, so every id decodes to text.

Output is deterministic: the same arguments and seed give byte-identical files from any
working directory (given the same numpy and spm_train versions). Each tensor draws from
its own generator, seeded by (seed, crc32(tensor name)), so a tensor's values do not
depend on the other options.

Weight scales keep activations finite and greedy continuations varied:
embeddings ~ N(0, 1); projections ~ N(0, 1/fan_in); biases ~ N(0, 0.2^2); norm weights
1 + N(0, 0.1^2); untied lm_head ~ N(0, 16/hidden) (logits of std ~4). Tied, the final
norm's weights are instead +-4/sqrt(hidden) * (1 + N(0, 0.1^2)) with random signs: with
all-positive weights a token's own embedding dominates its logits (e.e > e.e') and greedy
decoding repeats it forever; random signs make that self term average out. MoE routers
~ N(0, 4/hidden): router logits of std ~2, spread enough that the k-th and (k+1)-th
expert are seldom near a tie that float32 could break the other way, not so peaked that
the k-th expert's weight vanishes.

Example:
  /usr/bin/python3 tests/model_gen/make_test_model.py --preset tiny --out /tmp/tiny
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.txt")

PRESETS = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, intermediate_size=160,
                 tokenizer_vocab=512, max_position_embeddings=2048,
                 rope_theta=10000.0, rms_norm_eps=1e-5, dtype="f32"),
    "small": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, head_dim=64, intermediate_size=2048,
                  tokenizer_vocab=8192, max_position_embeddings=4096,
                  rope_theta=500000.0, rms_norm_eps=1e-5, dtype="bf16"),
}

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "mistral": "MistralForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}
MOE_TYPES = ("qwen3_moe", "mixtral")
TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
SAFETENSORS_DTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}
BYTES_PER_ELEMENT = {"f32": 4, "f16": 2, "bf16": 2}

ROPE_SCALING = {
    "none": None,
    # original_max_position_embeddings is small so that, at test lengths, the three
    # llama3 frequency bands (kept, smoothed, divided by factor) all occur.
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "linear": {"rope_type": "linear", "factor": 2.0},
    # YaRN as Qwen3 documents it (factor, original_max_position_embeddings; beta_fast 32,
    # beta_slow 1 and the attention factor 0.1 ln(factor) + 1 by default). The small
    # original context puts the ramp between kept and interpolated frequencies inside
    # head_dim. max_position_embeddings becomes factor * original (256), so a reader
    # that derives factor as their ratio agrees with transformers, which reads "factor".
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}

SPM_OPTIONS = [
    "--model_type=bpe", "--character_coverage=1.0", "--byte_fallback=true",
    "--num_threads=1", "--unk_id=0", "--bos_id=1", "--eos_id=2", "--pad_id=-1",
    "--input_sentence_size=0", "--hard_vocab_limit=false",
    # Llama-style normalization: none, so decode(encode(text)) == text.
    "--normalization_rule_name=identity", "--remove_extra_whitespaces=false",
    "--add_dummy_prefix=true", "--split_digits=true",
    "--allow_whitespace_only_pieces=true",
]
BOS_ID, EOS_ID = 1, 2


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", required=True, choices=sorted(PRESETS))
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(TORCH_DTYPES),
                   help="weight dtype (default: f32 for tiny, bf16 for small)")
    p.add_argument("--shards", type=int, default=1, help="number of safetensors files")
    p.add_argument("--tie-embeddings", action="store_true",
                   help="tie_word_embeddings: no lm_head.weight, logits use embed_tokens")
    p.add_argument("--qkv-bias", action="store_true",
                   help="biases on q/k/v (llama, qwen3, qwen3_moe: attention_bias, which "
                        "adds o_proj.bias too; implied by --model-type qwen2)")
    p.add_argument("--model-type", choices=sorted(ARCHITECTURES), default="llama")
    p.add_argument("--rope-scaling", choices=sorted(ROPE_SCALING), default="none")
    p.add_argument("--num-kv-heads", type=int, help="override the preset's kv head count")
    p.add_argument("--num-layers", type=int, help="override the preset's layer count")
    p.add_argument("--head-dim", type=int,
                   help="override the preset's head_dim (need not be hidden / heads)")
    p.add_argument("--intermediate-size", type=int,
                   help="override the preset's intermediate_size (dense MLPs; mixtral's "
                        "experts)")
    moe = p.add_argument_group("MoE (qwen3_moe, mixtral)")
    moe.add_argument("--num-experts", type=int, default=8,
                     help="num_experts (qwen3_moe) / num_local_experts (mixtral)")
    moe.add_argument("--experts-per-tok", type=int, default=2, help="num_experts_per_tok")
    moe.add_argument("--moe-intermediate-size", type=int, default=32,
                     help="qwen3_moe: each expert's intermediate size")
    moe.add_argument("--norm-topk-prob", action="store_true",
                     help="qwen3_moe: renormalise the top-k routing weights to sum to 1 "
                          "(mixtral always does)")
    moe.add_argument("--decoder-sparse-step", type=int, default=1,
                     help="qwen3_moe: layer i is sparse iff (i + 1) %% step == 0 and i is "
                          "not in --mlp-only-layers")
    moe.add_argument("--mlp-only-layers", type=int, nargs="*", default=[],
                     help="qwen3_moe: layers that keep a dense MLP")
    args = p.parse_args()
    preset = PRESETS[args.preset]
    heads = preset["num_attention_heads"]
    if args.num_kv_heads is not None and (args.num_kv_heads < 1 or heads % args.num_kv_heads):
        p.error(f"--num-kv-heads must divide num_attention_heads={heads}")
    if args.shards < 1:
        p.error("--shards must be >= 1")
    if args.model_type in ("mistral", "mixtral") and args.qkv_bias:
        p.error(f"{args.model_type} has no attention biases")
    if args.rope_scaling == "yarn" and args.model_type not in ("qwen3", "qwen3_moe"):
        p.error("--rope-scaling yarn is for qwen3 and qwen3_moe")
    if args.model_type in MOE_TYPES and not 1 <= args.experts_per_tok <= args.num_experts:
        p.error("need 1 <= --experts-per-tok <= --num-experts")
    return args


def train_tokenizer(vocab_size, out_dir):
    """Trains tokenizer.model into out_dir; returns its real piece count.

    spm_train runs in a scratch directory on relative paths because it records its
    input and model_prefix options inside the model file."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(CORPUS, os.path.join(tmp, "corpus.txt"))
        cmd = ["spm_train", "--input=corpus.txt", "--model_prefix=tokenizer",
               f"--vocab_size={vocab_size}"] + SPM_OPTIONS
        r = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            sys.exit("spm_train failed:\n" + r.stdout.decode(errors="replace")[-4000:])
        with open(os.path.join(tmp, "tokenizer.vocab"), encoding="utf-8") as f:
            pieces = sum(1 for _ in f)
        shutil.copyfile(os.path.join(tmp, "tokenizer.model"),
                        os.path.join(out_dir, "tokenizer.model"))
    return pieces


def make_config(args, preset, vocab_size, qkv_bias):
    layers = args.num_layers or preset["num_hidden_layers"]
    cfg = {
        "architectures": [ARCHITECTURES[args.model_type]],
        "model_type": args.model_type,
        "vocab_size": vocab_size,
        "hidden_size": preset["hidden_size"],
        "intermediate_size": args.intermediate_size or preset["intermediate_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": preset["num_attention_heads"],
        "num_key_value_heads": args.num_kv_heads or preset["num_key_value_heads"],
        "head_dim": args.head_dim or preset["head_dim"],
        "max_position_embeddings": preset["max_position_embeddings"],
        "rms_norm_eps": preset["rms_norm_eps"],
        "rope_theta": preset["rope_theta"],
        "rope_scaling": ROPE_SCALING[args.rope_scaling],
        "tie_word_embeddings": args.tie_embeddings,
        "hidden_act": "silu",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "torch_dtype": TORCH_DTYPES[args.dtype],
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if args.model_type == "llama":
        cfg["attention_bias"] = qkv_bias
        cfg["mlp_bias"] = False
    elif args.model_type == "mistral":
        cfg["sliding_window"] = None
    elif args.model_type == "qwen2":
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
    elif args.model_type in ("qwen3", "qwen3_moe"):
        # attention_bias: biases on q, k, v and o (Qwen3's own checkpoints have none).
        cfg["attention_bias"] = qkv_bias
        cfg["attention_dropout"] = 0.0
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
        cfg["max_window_layers"] = layers
        if args.model_type == "qwen3_moe":
            cfg["num_experts"] = args.num_experts
            cfg["num_experts_per_tok"] = args.experts_per_tok
            cfg["moe_intermediate_size"] = args.moe_intermediate_size
            cfg["norm_topk_prob"] = args.norm_topk_prob
            cfg["decoder_sparse_step"] = args.decoder_sparse_step
            cfg["mlp_only_layers"] = sorted(args.mlp_only_layers)
            cfg["output_router_logits"] = False
            cfg["router_aux_loss_coef"] = 0.001
    else:  # mixtral
        cfg["sliding_window"] = None
        cfg["attention_dropout"] = 0.0
        cfg["num_local_experts"] = args.num_experts
        cfg["num_experts_per_tok"] = args.experts_per_tok
        cfg["output_router_logits"] = False
        cfg["router_aux_loss_coef"] = 0.02
        cfg["router_jitter_noise"] = 0.0
    if args.rope_scaling == "yarn":
        yarn = cfg["rope_scaling"]
        cfg["max_position_embeddings"] = int(yarn["factor"] *
                                             yarn["original_max_position_embeddings"])
    return cfg


def is_sparse_layer(cfg, i):
    """Whether layer i has a sparse MoE block, as HF's Qwen3Moe/Mixtral decoder layers
    decide it."""
    if cfg["model_type"] == "mixtral":
        return True
    if cfg["model_type"] != "qwen3_moe":
        return False
    return (i not in cfg["mlp_only_layers"] and cfg["num_experts"] > 0
            and (i + 1) % cfg["decoder_sparse_step"] == 0)


def tensor_specs(cfg, qkv_bias, o_bias):
    """(name, shape, init kind, scale) for every tensor, in HF module order.

    Kinds: "normal" is N(0, scale^2); "norm" is 1 + N(0, scale^2); "signed_norm" is
    scale * (1 + N(0, 0.1^2)) with random signs."""
    h, ffn = cfg["hidden_size"], cfg["intermediate_size"]
    qk_norm = cfg["model_type"] in ("qwen3", "qwen3_moe")
    q_dim = cfg["num_attention_heads"] * cfg["head_dim"]
    kv_dim = cfg["num_key_value_heads"] * cfg["head_dim"]
    specs = [("model.embed_tokens.weight", (cfg["vocab_size"], h), "normal", 1.0)]

    def proj(name, out_dim, in_dim):
        specs.append((name, (out_dim, in_dim), "normal", in_dim ** -0.5))

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs.append((p + "input_layernorm.weight", (h,), "norm", 0.1))
        for name, dim in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
            proj(f"{p}self_attn.{name}_proj.weight", dim, h)
            if qkv_bias:
                specs.append((f"{p}self_attn.{name}_proj.bias", (dim,), "normal", 0.2))
        proj(p + "self_attn.o_proj.weight", h, q_dim)
        if o_bias:
            specs.append((p + "self_attn.o_proj.bias", (h,), "normal", 0.2))
        if qk_norm:
            specs.append((p + "self_attn.q_norm.weight", (cfg["head_dim"],), "norm", 0.1))
            specs.append((p + "self_attn.k_norm.weight", (cfg["head_dim"],), "norm", 0.1))
        specs.append((p + "post_attention_layernorm.weight", (h,), "norm", 0.1))
        if cfg["model_type"] == "mixtral":
            experts = cfg["num_local_experts"]
            specs.append((p + "block_sparse_moe.gate.weight", (experts, h), "normal",
                          2.0 * h ** -0.5))
            for e in range(experts):
                q = f"{p}block_sparse_moe.experts.{e}."
                proj(q + "w1.weight", ffn, h)  # gate
                proj(q + "w2.weight", h, ffn)  # down
                proj(q + "w3.weight", ffn, h)  # up
        elif is_sparse_layer(cfg, i):
            experts, moe_ffn = cfg["num_experts"], cfg["moe_intermediate_size"]
            specs.append((p + "mlp.gate.weight", (experts, h), "normal", 2.0 * h ** -0.5))
            for e in range(experts):
                q = f"{p}mlp.experts.{e}."
                proj(q + "gate_proj.weight", moe_ffn, h)
                proj(q + "up_proj.weight", moe_ffn, h)
                proj(q + "down_proj.weight", h, moe_ffn)
        else:
            proj(p + "mlp.gate_proj.weight", ffn, h)
            proj(p + "mlp.up_proj.weight", ffn, h)
            proj(p + "mlp.down_proj.weight", h, ffn)
    if cfg["tie_word_embeddings"]:
        specs.append(("model.norm.weight", (h,), "signed_norm", 4.0 * h ** -0.5))
    else:
        specs.append(("model.norm.weight", (h,), "norm", 0.1))
        specs.append(("lm_head.weight", (cfg["vocab_size"], h), "normal", 4.0 * h ** -0.5))
    return specs


def tensor_bytes(name, shape, kind, scale, seed, dtype):
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    x = rng.standard_normal(shape, dtype=np.float32)
    if kind == "normal":
        x *= np.float32(scale)
    elif kind == "norm":
        x = np.float32(1.0) + np.float32(scale) * x
    else:  # signed_norm
        sign = rng.integers(0, 2, shape).astype(np.float32) * 2 - 1
        x = np.float32(scale) * (np.float32(1.0) + np.float32(0.1) * x) * sign
    if dtype == "f32":
        return x.astype("<f4").tobytes()
    if dtype == "f16":
        return x.astype("<f2").tobytes()
    # bf16: upper half of the f32 bits, rounded to nearest even.
    u = x.view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return u.astype("<u2").tobytes()


def split_shards(specs, dtype, n):
    """Splits the ordered specs into n contiguous, non-empty groups of similar size."""
    if n > len(specs):
        sys.exit(f"--shards {n} exceeds the {len(specs)} tensors")
    total = sum(int(np.prod(s)) for _, s, _, _ in specs) * BYTES_PER_ELEMENT[dtype]
    groups, done = [[]], 0
    for i, spec in enumerate(specs):
        k = len(groups) - 1
        if groups[k] and k < n - 1 and (done >= total * (k + 1) / n
                                         or len(specs) - i == n - 1 - k):
            groups.append([])
        groups[-1].append(spec)
        done += int(np.prod(spec[1])) * BYTES_PER_ELEMENT[dtype]
    return groups


def write_safetensors(path, specs, seed, dtype):
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _, _ in specs:
        size = int(np.prod(shape)) * BYTES_PER_ELEMENT[dtype]
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for spec in specs:
            f.write(tensor_bytes(*spec, seed, dtype))
    return offset


def main():
    args = parse_args()
    preset = PRESETS[args.preset]
    args.dtype = args.dtype or preset["dtype"]
    qkv_bias = args.qkv_bias or args.model_type == "qwen2"
    # HF Llama's and Qwen3's attention_bias covers o_proj too; Qwen2's biases do not.
    o_bias = qkv_bias and args.model_type in ("llama", "qwen3", "qwen3_moe")

    os.makedirs(args.out, exist_ok=True)
    vocab_size = train_tokenizer(preset["tokenizer_vocab"], args.out)
    cfg = make_config(args, preset, vocab_size, qkv_bias)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    specs = tensor_specs(cfg, qkv_bias, o_bias)
    files = ["config.json", "tokenizer.model"]
    if args.shards == 1:
        write_safetensors(os.path.join(args.out, "model.safetensors"), specs, args.seed,
                          args.dtype)
        files.append("model.safetensors")
    else:
        weight_map, total = {}, 0
        for k, group in enumerate(split_shards(specs, args.dtype, args.shards)):
            fname = f"model-{k + 1:05d}-of-{args.shards:05d}.safetensors"
            total += write_safetensors(os.path.join(args.out, fname), group, args.seed,
                                       args.dtype)
            weight_map.update({name: fname for name, _, _, _ in group})
            files.append(fname)
        index = {"metadata": {"total_size": total},
                 "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
        files.append("model.safetensors.index.json")

    params = sum(int(np.prod(s)) for _, s, _, _ in specs)
    listing = ", ".join(f"{n} ({os.path.getsize(os.path.join(args.out, n))} B)"
                        for n in files)
    print(f"{args.preset} {args.model_type} {args.dtype}: {params} params, vocab "
          f"{vocab_size}, {args.out}: {listing}")


if __name__ == "__main__":
    main()
