#!/usr/bin/python3
"""Independent float64 numpy reference of the Hugging Face Llama forward pass.

It checks Conveyor's kernels: given a checkpoint in HF layout (config.json plus
model.safetensors, or shards listed in model.safetensors.index.json; F32/F16/BF16) and a
list of prompts, it writes each prompt's logits at every position and its greedy
continuation. It follows HF's LlamaForCausalLM formulas (also Mistral and Qwen2, which
differ only in which biases exist): RMSNorm, q/k/v projections (+bias when present),
rotate-half RoPE with optional linear, llama3 or yarn frequency scaling, grouped-query
causal attention, o_proj (+bias when present), SwiGLU MLP, final norm, lm_head (or the
tied embedding). Qwen3 and Qwen3-MoE add an RMSNorm over each head of q and k (before
RoPE); Qwen3-MoE and Mixtral replace the MLP of their sparse layers by a mixture of
experts: softmax over the router logits, the top k experts (ties to the lower index),
their probabilities renormalised to sum 1 (Mixtral; Qwen3-MoE iff norm_topk_prob), and
the sum of each chosen expert's SwiGLU output times its weight. It shares no code with
Conveyor.

Output JSON: {"prompts": [{"tokens": [...], "logits": [[vocab floats] per prompt
position], "greedy": [ids], "greedy_margins": [top1 - top2 logit per greedy step]}]}.
Each greedy token is the argmax of the last position of a full forward over the prompt
plus the tokens generated so far (no KV cache). A small margin flags a near-tie that a
float32 implementation may legitimately break the other way. Floats have 9 significant
digits (exact float32 round trip).

MoE models add, per prompt, "routing_margin": the smallest gap between the k-th and
(k+1)-th largest routing probability over every token and sparse layer of the prompt's
forward, and "greedy_routing_margin": the same over the prompt plus all generated
tokens but the last (the forward that picked the last greedy token);
"routing_logit_margin" and "greedy_routing_logit_margin" are the same gaps between
router logits, the scale-free measure to compare with float32 rounding (a probability
gap is about the logit gap times the k-th probability). A tiny gap flags a near-tie in
expert choice that float32 may break the other way.

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


def yarn_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(cfg, scaling, head_dim):
    """transformers' _compute_yarn_parameters: (inv_freq, attention factor)."""
    base = cfg.get("rope_theta", 10000.0)
    old_ctx = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor")
    if factor is None:
        factor = cfg["max_position_embeddings"] / old_ctx
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations):
        # The dimension whose wavelength makes `rotations` turns over old_ctx positions.
        return head_dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos_freqs = base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    # ramp 0: the original frequency (extrapolation); ramp 1: divided by factor.
    inv_freq = (1 - ramp) / pos_freqs + ramp / (factor * pos_freqs)
    return inv_freq, attention_factor


def rope_inv_freq(cfg, head_dim):
    """HF rope init functions: default, linear, llama3 and yarn.

    Returns (inv_freq, attention factor); the factor multiplies cos and sin (yarn)."""
    inv_freq = 1.0 / cfg.get("rope_theta", 10000.0) ** (
        np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = cfg.get("rope_scaling")
    if not scaling:
        return inv_freq, 1.0
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "yarn":
        return yarn_inv_freq(cfg, scaling, head_dim)
    factor = scaling["factor"]
    if kind == "linear":
        return inv_freq / factor, 1.0
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
        return np.where(medium, smoothed, scaled), 1.0
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


def swiglu(h, weights, gate, up, down):
    g = linear(h, weights, gate)
    return linear(g / (1 + np.exp(-g)) * linear(h, weights, up), weights, down)


def is_sparse_layer(cfg, i):
    """HF Qwen3MoeDecoderLayer / MixtralDecoderLayer: does layer i have a MoE block?"""
    kind = cfg.get("model_type")
    if kind == "mixtral":
        return True
    if kind != "qwen3_moe":
        return False
    return (i not in (cfg.get("mlp_only_layers") or []) and cfg["num_experts"] > 0
            and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def moe(cfg, weights, prefix, h, margins):
    """Sparse MoE block output for h [n, hidden]; appends each token's routing margins
    (k-th minus (k+1)-th probability, and the same for router logits) to `margins`."""
    if cfg["model_type"] == "mixtral":
        experts, normalize = cfg["num_local_experts"], True
        prefix += "block_sparse_moe."
        names = ("w1", "w3", "w2")  # gate, up, down
    else:
        experts, normalize = cfg["num_experts"], cfg.get("norm_topk_prob", False)
        prefix += "mlp."
        names = ("gate_proj", "up_proj", "down_proj")
    k = cfg["num_experts_per_tok"]
    logits = h @ weights[prefix + "gate.weight"].T  # [n, experts]
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    order = np.argsort(-probs, axis=-1, kind="stable")  # Ties: lower index first.
    chosen = order[:, :k]
    route = np.take_along_axis(probs, chosen, axis=-1)
    if k < experts:
        nxt = np.take_along_axis(probs, order[:, k:k + 1], axis=-1)
        kth = np.take_along_axis(logits, order[:, k - 1:k + 1], axis=-1)
        margins.extend(zip((route[:, -1] - nxt[:, 0]).tolist(),
                           (kth[:, 0] - kth[:, 1]).tolist()))
    if normalize:
        route = route / route.sum(axis=-1, keepdims=True)
    out = np.zeros_like(h)
    for e in range(experts):
        rows, slot = np.nonzero(chosen == e)
        if rows.size == 0:
            continue
        p = f"{prefix}experts.{e}."
        y = swiglu(h[rows], weights, *(p + name for name in names))
        out[rows] += y * route[rows, slot][:, None]
    return out


def forward(cfg, weights, tokens, routing_margins=None):
    """Logits [len(tokens), vocab] for one sequence starting at position 0.

    MoE models append every token's routing margin to routing_margins (a list)."""
    n = len(tokens)
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads")
    kv_heads = kv_heads or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    eps = cfg["rms_norm_eps"]
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if window is not None and n > window:
        raise NotImplementedError(f"sequence of {n} exceeds sliding_window {window}")

    inv_freq, rope_scale = rope_inv_freq(cfg, head_dim)
    angles = np.arange(n, dtype=np.float64)[:, None] * inv_freq[None]
    cos = np.cos(np.concatenate([angles, angles], axis=-1)) * rope_scale  # [n, head_dim]
    sin = np.sin(np.concatenate([angles, angles], axis=-1)) * rope_scale
    qk_norm = cfg.get("model_type") in ("qwen3", "qwen3_moe")
    margins = [] if routing_margins is None else routing_margins
    causal = np.triu(np.full((n, n), -np.inf), k=1)
    group = heads // kv_heads

    x = weights["model.embed_tokens.weight"][np.asarray(tokens)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, weights[p + "input_layernorm.weight"], eps)
        q = linear(h, weights, p + "self_attn.q_proj").reshape(n, heads, head_dim)
        k = linear(h, weights, p + "self_attn.k_proj").reshape(n, kv_heads, head_dim)
        v = linear(h, weights, p + "self_attn.v_proj").reshape(n, kv_heads, head_dim)
        if qk_norm:  # Over each head's head_dim values, before RoPE.
            q = rms_norm(q, weights[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, weights[p + "self_attn.k_norm.weight"], eps)
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
        if is_sparse_layer(cfg, i):
            x = x + moe(cfg, weights, p, h, margins)
        else:
            x = x + swiglu(h, weights, p + "mlp.gate_proj", p + "mlp.up_proj",
                           p + "mlp.down_proj")

    x = rms_norm(x, weights["model.norm.weight"], eps)
    lm_head = weights.get("lm_head.weight")
    if lm_head is None or cfg.get("tie_word_embeddings", False):
        lm_head = weights["model.embed_tokens.weight"]
    logits = x @ lm_head.T
    if not np.all(np.isfinite(logits)):
        raise FloatingPointError("non-finite logits")
    return logits


def greedy(cfg, weights, prompt, steps, routing_margins=None):
    """Greedy ids and top1 - top2 margins, one full forward per step.

    routing_margins (a list) gets those of the last step's forward, which covers every
    token before the last one (routing is causal)."""
    seq, ids, margins = list(prompt), [], []
    for step in range(steps):
        route = routing_margins if step == steps - 1 else None
        last = forward(cfg, weights, seq, route)[-1]
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
        routing, greedy_routing = [], []
        logits = forward(cfg, weights, prompt, routing)
        ids, margins = greedy(cfg, weights, prompt, args.greedy_tokens, greedy_routing)
        extra = ""
        if routing:
            greedy_routing = greedy_routing or routing
            extra = ",\n" + ",".join(
                f'"{key}":{min(m[j] for m in margins):.9g}'
                for margins, prefix in ((routing, ""), (greedy_routing, "greedy_"))
                for j, key in ((0, prefix + "routing_margin"),
                               (1, prefix + "routing_logit_margin")))
        entries.append(
            '{"tokens":' + json.dumps(prompt) +
            ',\n"logits":[\n' + ",\n".join(floats(row) for row in logits) +
            '],\n"greedy":' + json.dumps(ids) +
            ',\n"greedy_margins":' + floats(margins) + extra + "}")
    with open(args.out, "w") as f:
        f.write('{"prompts":[\n' + ",\n".join(entries) + "]}\n")


if __name__ == "__main__":
    main()
