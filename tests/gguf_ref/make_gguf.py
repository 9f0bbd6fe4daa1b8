#!/usr/bin/env python3
"""Writes the GGUF files checkpoint/gguf_test.cc reads, with the `gguf` package (PyPI,
llama.cpp's own writer), and the reference dequantization of every tensor in them.

  make_gguf.py --out DIR
  make_gguf.py --seeds tests/fuzz/corpus/gguf_fuzzer   # the fuzzer's seed corpus

DIR/types.gguf: metadata of every value type (nested arrays too) and one tensor per
supported ggml type. F32/F16/BF16/Q8_0/Q4_0/Q4_1 are quantized by gguf.quants.quantize from
random floats; gguf cannot quantize K-quants, so Q4_K/Q5_K/Q6_K tensors are random block
bytes whose fp16 scales are finite. DIR/<tensor>.f32 holds gguf.quants.dequantize of each
tensor's bytes (float32, row-major), the values the C++ dequantization must equal bit for
bit. DIR/llama.gguf and DIR/qwen3moe.gguf are tiny models whose metadata and tensor names
convert_hf_to_gguf.py would write, for the config mapping.
"""
import argparse
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

ROWS = 4
COLS = 512  # Two K-quant super-blocks, sixteen 32-element blocks per row.


def random_k_blocks(rng, qtype, rows, cols):
    """Random bytes for `rows` x `cols` elements of K-quant `qtype`, fp16 scales finite."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block_elems, block_bytes), dtype=np.uint8)
    # Offsets of the fp16 scale(s) in each block (ggml-common.h).
    half_offsets = {T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [block_bytes - 2]}[qtype]
    for offset in half_offsets:
        scales = rng.uniform(-2.0, 2.0, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def write_types(out, rng, rows=ROWS, cols=COLS, name="types.gguf"):
    w = gguf.GGUFWriter(os.path.join(out, name), "llama")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.125)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**40))
    w.add_float64("test.f64", 1e300)
    w.add_array("test.strings", ["a", "", "ccc"])
    w.add_array("test.floats", [1.5, -2.5])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_array("test.nested_strings", [["x"], ["y", "z"]])

    floats = rng.standard_normal((rows, cols)).astype(np.float32)
    tensors = {
        "f32": (floats, None),
        "f16": (floats.astype(np.float16), None),
        "bf16": (gguf.quants.quantize(floats, T.BF16), T.BF16),
        "q8_0": (gguf.quants.quantize(floats, T.Q8_0), T.Q8_0),
        "q4_0": (gguf.quants.quantize(floats, T.Q4_0), T.Q4_0),
        "q4_1": (gguf.quants.quantize(floats, T.Q4_1), T.Q4_1),
        "q4_k": (random_k_blocks(rng, T.Q4_K, rows, cols), T.Q4_K),
        "q5_k": (random_k_blocks(rng, T.Q5_K, rows, cols), T.Q5_K),
        "q6_k": (random_k_blocks(rng, T.Q6_K, rows, cols), T.Q6_K),
    }
    for tensor_name, (data, raw_dtype) in tensors.items():
        w.add_tensor(tensor_name, data, raw_dtype=raw_dtype)
        qtype = raw_dtype if raw_dtype is not None else {np.float32: T.F32,
                                                         np.float16: T.F16}[data.dtype.type]
        expected = gguf.quants.dequantize(data, qtype).astype(np.float32)
        assert expected.shape == (rows, cols), (tensor_name, expected.shape)
        if name == "types.gguf":
            expected.tofile(os.path.join(out, tensor_name + ".f32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_model(out, arch, rng, experts=0):
    """A two-layer model as convert_hf_to_gguf would name and describe it."""
    hidden, heads, kv_heads, head_dim, ff, vocab, layers = 64, 4, 2, 32, 128, 96, 2
    w = gguf.GGUFWriter(os.path.join(out, arch + ".gguf"), arch)
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(1024)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(48)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    w.add_tensor("token_embd.weight", f32(vocab, hidden))
    w.add_tensor("output_norm.weight", f32(hidden))
    if arch == "llama":
        w.add_tensor("output.weight", f32(vocab, hidden))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", f32(hidden))
        w.add_tensor(f"blk.{i}.attn_q.weight", f32(heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", f32(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", f32(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", f32(hidden, heads * head_dim))
        if arch != "llama":
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", f32(head_dim))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", f32(head_dim))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", f32(hidden))
        if experts and i == 1:  # Layer 0 dense, layer 1 sparse.
            w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", f32(experts, hidden))
            w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", f32(experts, 48, hidden))
            w.add_tensor(f"blk.{i}.ffn_up_exps.weight", f32(experts, 48, hidden))
            w.add_tensor(f"blk.{i}.ffn_down_exps.weight", f32(experts, hidden, 48))
        else:
            w.add_tensor(f"blk.{i}.ffn_gate.weight", f32(ff, hidden))
            w.add_tensor(f"blk.{i}.ffn_up.weight", f32(ff, hidden))
            w.add_tensor(f"blk.{i}.ffn_down.weight", f32(hidden, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tokenizer_seeds(out_dir):
    """Two files holding only a small tokenizer (text/gguf_tokenizer.h): a byte-level one
    with merges and a sentencepiece-style one with scores, for the fuzzer to mutate."""
    w = gguf.GGUFWriter(os.path.join(out_dir, "seed-tokenizer-gpt2"), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(["a", "b", "ab", "\u0120", "\u0120ab", "<|end|>", "<think>"])
    w.add_token_types([1, 1, 1, 1, 1, 3, 4])
    w.add_token_merges(["a b", "\u0120 ab"])
    w.add_eos_token_id(5)
    w.add_chat_template("{{ messages[0]['content'] }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    w = gguf.GGUFWriter(os.path.join(out_dir, "seed-tokenizer-llama"), "llama")
    w.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [
        "\u2581", "a", "b", "ab", "\u2581ab"]
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * 5)
    w.add_token_scores([0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--seeds", help="write the fuzzer's seed corpus here instead")
    args = parser.parse_args()
    rng = np.random.default_rng(20240601)
    if args.seeds:
        # One 256-element row per type: small, and every parser path and block kind.
        os.makedirs(args.seeds, exist_ok=True)
        write_types(args.seeds, rng, rows=1, cols=256, name="seed-types")
        with open(os.path.join(args.seeds, "seed-types"), "rb") as f:
            image = f.read()
        with open(os.path.join(args.seeds, "seed-types-truncated"), "wb") as f:
            f.write(image[:len(image) // 2])
        write_tokenizer_seeds(args.seeds)
        return
    write_types(args.out, rng)
    write_model(args.out, "llama", rng)
    write_model(args.out, "qwen3moe", rng, experts=4)


if __name__ == "__main__":
    main()
