#!/usr/bin/env python3
"""Writes a tiny Hugging Face test checkpoint (tests/make_test_data.sh's variants) as one
GGUF file, the way llama.cpp's convert_hf_to_gguf.py would, with the `gguf` package:
the same metadata keys, tensor names (Mixtral's experts merged into blk.N.ffn_*_exps),
and for the llama architecture the Q/K row permutation of LlamaModel.permute. Used by
tests/worker/gguf_model_test.cc to load the same weights from both formats.

  hf_to_gguf.py --model DIR --out FILE.gguf [--type f32|q8_0|q4_1|q5_0]

--type q8_0 quantizes every matrix whose rows are whole Q8_0 blocks (as convert does,
the rest, vectors included, stay F32); --type q4_1 likewise; --type q5_0 likewise with a
type Conveyor refuses.

The checkpoint's tokenizer.model goes in as convert_hf_to_gguf's _set_vocab_sentencepiece
writes it (tokenizer.ggml.model "llama", the pieces, scores and token types, the unknown
token, add_space_prefix from its normalizer spec; no merges), read from the model file's
protobuf directly (no sentencepiece package); --chat-template TEXT adds
tokenizer.chat_template, which convert copies from tokenizer_config.json.
"""
import argparse
import json
import math
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T



def llama3_frequency_factors(theta, head_dim, scaling):
    """Llama 3's rope_scaling as the divisor of each inverse frequency: what llama.cpp's
    converter writes as rope_freqs.weight. From transformers' definition: frequencies
    whose wavelength is under original/high_freq_factor are kept, those over
    original/low_freq_factor divided by factor, and those between blended linearly in
    original/wavelength."""
    factor = scaling["factor"]
    low = scaling.get("low_freq_factor", 1.0)
    high = scaling.get("high_freq_factor", 4.0)
    original = scaling.get("original_max_position_embeddings", 8192)
    factors = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            factors.append(1.0)
        elif wavelen > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)

def read_safetensors(model_dir):
    """Every tensor of the checkpoint as float32 numpy arrays (no safetensors package)."""
    tensors = {}
    for name in sorted(os.listdir(model_dir)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model_dir, name), "rb") as f:
            blob = f.read()
        header_len = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8:8 + header_len])
        data = blob[8 + header_len:]
        for key, info in header.items():
            if key == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            raw = data[begin:end]
            dtype = info["dtype"]
            if dtype == "F32":
                values = np.frombuffer(raw, dtype=np.float32)
            elif dtype == "F16":
                values = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
            elif dtype == "BF16":
                values = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(
                    np.float32)
            else:
                raise ValueError(f"{key}: dtype {dtype}")
            tensors[key] = values.reshape(info["shape"]).copy()
    return tensors


def protobuf_fields(blob):
    """(field number, wire type, value) of one protobuf message: ints for varints and
    fixed32/64 (raw), bytes for length-delimited fields."""
    i = 0

    def varint():
        nonlocal i
        result = shift = 0
        while True:
            b = blob[i]
            i += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return result

    while i < len(blob):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, wire, varint()
        elif wire == 1:
            yield number, wire, blob[i:i + 8]
            i += 8
        elif wire == 2:
            n = varint()
            yield number, wire, blob[i:i + n]
            i += n
        elif wire == 5:
            yield number, wire, blob[i:i + 4]
            i += 4
        else:
            raise ValueError(f"protobuf wire type {wire}")


def read_sentencepiece(path):
    """sentencepiece's ModelProto: pieces (piece, score, type; type NORMAL=1 by default)
    and NormalizerSpec.add_dummy_prefix (default true)."""
    with open(path, "rb") as f:
        blob = f.read()
    pieces, add_dummy_prefix = [], True
    for number, _, value in protobuf_fields(blob):
        if number == 1:  # SentencePiece
            piece, score, kind = "", 0.0, 1
            for n, _, v in protobuf_fields(value):
                if n == 1:
                    piece = v.decode("utf-8")
                elif n == 2:
                    score = float(np.frombuffer(v, dtype="<f4")[0])
                elif n == 3:
                    kind = v
            pieces.append((piece, score, kind))
        elif number == 3:  # NormalizerSpec
            for n, _, v in protobuf_fields(value):
                if n == 3:
                    add_dummy_prefix = bool(v)
    return pieces, add_dummy_prefix


def add_tokenizer(w, model_dir, cfg, chat_template):
    """The tokenizer metadata convert_hf_to_gguf writes for a sentencepiece model."""
    pieces, add_dummy_prefix = read_sentencepiece(os.path.join(model_dir, "tokenizer.model"))
    # sentencepiece's types are llama.cpp's token types (NORMAL 1 ... BYTE 6).
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([p for p, _, _ in pieces])
    w.add_token_scores([s for _, s, _ in pieces])
    w.add_token_types([t for _, _, t in pieces])
    unknown = [i for i, (_, _, t) in enumerate(pieces) if t == gguf.TokenType.UNKNOWN]
    if unknown:
        w.add_unk_token_id(unknown[0])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_bool("tokenizer.ggml.add_space_prefix", add_dummy_prefix)
    if chat_template is not None:
        w.add_chat_template(chat_template)


def permute(w, n_head):
    """convert_hf_to_gguf's LlamaModel.permute."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--type", choices=["f32", "q8_0", "q4_1", "q5_0"], default="f32")
    p.add_argument("--chat-template", help="tokenizer.chat_template to write")
    args = p.parse_args()
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    hf = read_safetensors(args.model)
    model_type = cfg["model_type"]
    arch = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2"}[model_type]
    llama_arch = arch == "llama"
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads

    w = gguf.GGUFWriter(args.out, arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    scaling = cfg.get("rope_scaling")
    rope_freqs = None
    if scaling:
        if scaling["rope_type"] == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(scaling["factor"])
        elif scaling["rope_type"] == "llama3":
            rope_freqs = llama3_frequency_factors(cfg["rope_theta"], head_dim, scaling)
        else:
            raise ValueError(f"rope_scaling {scaling['rope_type']} not written")
    if model_type == "mixtral":
        w.add_expert_count(cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    add_tokenizer(w, args.model, cfg, args.chat_template)

    def add(name, values):
        values = np.ascontiguousarray(values, dtype=np.float32)
        qtype = {"q8_0": T.Q8_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0}.get(args.type)
        if qtype is not None and values.ndim >= 2 and values.shape[-1] % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, values)

    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)  # float32 whatever --type says.
    add("token_embd.weight", hf["model.embed_tokens.weight"])
    add("output_norm.weight", hf["model.norm.weight"])
    if "lm_head.weight" in hf and not cfg.get("tie_word_embeddings"):
        add("output.weight", hf["lm_head.weight"])
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        blk = f"blk.{i}."
        add(blk + "attn_norm.weight", hf[pre + "input_layernorm.weight"])
        add(blk + "ffn_norm.weight", hf[pre + "post_attention_layernorm.weight"])
        for proj, gguf_name, n in (("q", "attn_q", heads), ("k", "attn_k", kv_heads),
                                   ("v", "attn_v", 0)):
            for kind in ("weight", "bias"):
                key = f"{pre}self_attn.{proj}_proj.{kind}"
                if key in hf:
                    values = hf[key]
                    if llama_arch and n:
                        values = permute(values, n)
                    add(f"{blk}{gguf_name}.{kind}", values)
        add(blk + "attn_output.weight", hf[pre + "self_attn.o_proj.weight"])
        if model_type == "mixtral":
            moe = pre + "block_sparse_moe."
            experts = cfg["num_local_experts"]
            add(blk + "ffn_gate_inp.weight", hf[moe + "gate.weight"])
            for gguf_name, hf_name in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
                add(f"{blk}ffn_{gguf_name}_exps.weight",
                    np.stack([hf[f"{moe}experts.{e}.{hf_name}.weight"] for e in range(experts)]))
        else:
            for proj in ("gate", "up", "down"):
                add(f"{blk}ffn_{proj}.weight", hf[f"{pre}mlp.{proj}_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
