#!/usr/bin/python3
"""Independent float64 numpy reference of the Hugging Face Llama forward pass.

It checks Conveyor's kernels: given a checkpoint in HF layout (config.json plus
model.safetensors, or shards listed in model.safetensors.index.json; F32/F16/BF16) and a
list of prompts, it writes each prompt's logits at every position and its greedy
continuation. It follows HF's LlamaForCausalLM formulas (also Mistral and Qwen2, which
differ only in which biases exist): RMSNorm, q/k/v projections (+bias when present),
rotate-half RoPE with optional linear or llama3 frequency scaling, grouped-query causal
attention, o_proj (+bias when present), SwiGLU MLP, final norm, lm_head (or the tied
embedding). It shares no code with Conveyor.

Output JSON: {"prompts": [{"tokens": [...], "logits": [[vocab floats] per prompt
position], "greedy": [ids], "greedy_margins": [top1 - top2 logit per greedy step]}]}.
Each greedy token is the argmax of the last position of a full forward over the prompt
plus the tokens generated so far (no KV cache). A small margin flags a near-tie that a
float32 implementation may legitimately break the other way. Floats have 9 significant
digits (exact float32 round trip).

Example:
  /usr/bin/python3 tests/reference/llama_ref.py --model /tmp/tiny \\
      --prompts prompts.json --out ref.json
"""

import argparse
import json
import math
import os
import struct

import numpy as np


def read_safetensors(path):
    """Returns {name: float64 array} for every tensor in one safetensors file."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        if info["dtype"] == "F32":
            x = raw.view("<f4")
        elif info["dtype"] == "F16":
            x = raw.view("<f2")
        elif info["dtype"] == "BF16":
            x = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: {name}: unsupported dtype {info['dtype']}")
        tensors[name] = x.astype(np.float64).reshape(info["shape"])
    return tensors


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(read_safetensors(os.path.join(model_dir, name)))
    return cfg, weights


def rope_inv_freq(cfg, head_dim):
    """HF rope init functions: default, linear and llama3."""
    inv_freq = 1.0 / cfg.get("rope_theta", 10000.0) ** (
        np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = cfg.get("rope_scaling")
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = scaling["factor"]
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        old_ctx = scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        low_freq_wavelen = old_ctx / low
        high_freq_wavelen = old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return np.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope_scaling type {kind!r}")


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def linear(x, weights, prefix):
    y = x @ weights[prefix + ".weight"].T
    bias = weights.get(prefix + ".bias")
    return y if bias is None else y + bias


def forward(cfg, weights, tokens):
    """Logits [len(tokens), vocab] for one sequence starting at position 0."""
    n = len(tokens)
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads")
    kv_heads = kv_heads or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    eps = cfg["rms_norm_eps"]
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if window is not None and n > window:
        raise NotImplementedError(f"sequence of {n} exceeds sliding_window {window}")

    angles = np.arange(n, dtype=np.float64)[:, None] * rope_inv_freq(cfg, head_dim)[None]
    cos = np.cos(np.concatenate([angles, angles], axis=-1))  # [n, head_dim]
    sin = np.sin(np.concatenate([angles, angles], axis=-1))
    causal = np.triu(np.full((n, n), -np.inf), k=1)
    group = heads // kv_heads

    x = weights["model.embed_tokens.weight"][np.asarray(tokens)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, weights[p + "input_layernorm.weight"], eps)
        q = linear(h, weights, p + "self_attn.q_proj").reshape(n, heads, head_dim)
        k = linear(h, weights, p + "self_attn.k_proj").reshape(n, kv_heads, head_dim)
        v = linear(h, weights, p + "self_attn.v_proj").reshape(n, kv_heads, head_dim)
        q = q.transpose(1, 0, 2)  # [heads, n, head_dim]
        k = k.transpose(1, 0, 2)
        v = v.transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, group, axis=0)  # q head j uses kv head j // group.
        v = np.repeat(v, group, axis=0)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim) + causal
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        attn = (probs @ v).transpose(1, 0, 2).reshape(n, heads * head_dim)
        x = x + linear(attn, weights, p + "self_attn.o_proj")

        h = rms_norm(x, weights[p + "post_attention_layernorm.weight"], eps)
        gate = linear(h, weights, p + "mlp.gate_proj")
        up = linear(h, weights, p + "mlp.up_proj")
        x = x + linear(gate / (1 + np.exp(-gate)) * up, weights, p + "mlp.down_proj")

    x = rms_norm(x, weights["model.norm.weight"], eps)
    lm_head = weights.get("lm_head.weight")
    if lm_head is None or cfg.get("tie_word_embeddings", False):
        lm_head = weights["model.embed_tokens.weight"]
    logits = x @ lm_head.T
    if not np.all(np.isfinite(logits)):
        raise FloatingPointError("non-finite logits")
    return logits


def greedy(cfg, weights, prompt, steps):
    """Greedy ids and top1 - top2 margins, one full forward per step."""
    seq, ids, margins = list(prompt), [], []
    for _ in range(steps):
        last = forward(cfg, weights, seq)[-1]
        top2 = np.argsort(last)[-2:]
        ids.append(int(top2[1]))
        margins.append(float(last[top2[1]] - last[top2[0]]))
        seq.append(ids[-1])
    return ids, margins


def floats(values):
    return "[" + ",".join(f"{v:.9g}" for v in values) + "]"


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory (HF layout)")
    p.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    p.add_argument("--out", required=True, help="output JSON file")
    p.add_argument("--greedy-tokens", type=int, default=32,
                   help="greedy tokens to generate per prompt (default 32)")
    args = p.parse_args()

    cfg, weights = load_model(args.model)
    with open(args.prompts) as f:
        prompts = json.load(f)
    vocab = cfg["vocab_size"]
    entries = []
    for prompt in prompts:
        if not prompt or not all(0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt must be non-empty ids below {vocab}: {prompt}")
        logits = forward(cfg, weights, prompt)
        ids, margins = greedy(cfg, weights, prompt, args.greedy_tokens)
        entries.append(
            '{"tokens":' + json.dumps(prompt) +
            ',\n"logits":[\n' + ",\n".join(floats(row) for row in logits) +
            '],\n"greedy":' + json.dumps(ids) +
            ',\n"greedy_margins":' + floats(margins) + "}")
    with open(args.out, "w") as f:
        f.write('{"prompts":[\n' + ",\n".join(entries) + "]}\n")


if __name__ == "__main__":
    main()
