#!/usr/bin/env python3
"""Writes a Hugging Face test checkpoint (tests/make_test_data.sh's variants) as a
block-wise FP8 checkpoint, with an independent numpy reference, for
tests/worker/fp8_model_test.cc.

  make_fp8.py --model SRC --out DIR --reference REF_DIR [--block ROWS COLS] [--scale-dtype F32|BF16]

The format is transformers' FineGrainedFP8Config (quant_method "fp8", as Qwen3's and
DeepSeek-V3's FP8 checkpoints store it): every linear layer of the decoder layers
(`*_proj.weight`, Mixtral's `w1/w2/w3`) becomes `<layer>.weight` in float8_e4m3fn
[out, in] ("F8_E4M3") and `<layer>.weight_scale_inv` [ceil(out / ROWS), ceil(in / COLS)],
one scale per block (the block's largest magnitude / 448, e4m3's largest value), each
weight rounded to the nearest e4m3 value of weight / scale (ties to the even code). The
rest (embeddings, norms, lm_head, biases) is copied as float32; config.json gains the
quantization_config.

REF_DIR gets the same checkpoint with each FP8 weight dequantized from the format's
definition alone: e4m3's value of each code (computed from its bits here, not by the
encoder's table), times its block's scale, one float32 multiplication. The C++ reader must
give these values bit for bit.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gguf_ref"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_to_gguf import read_safetensors  # noqa: E402
from make_gptq_awq import QUANTIZED, copy_side_files, write_safetensors  # noqa: E402

E4M3_MAX = 448.0


def e4m3_value(code):
    """The float value of float8_e4m3fn bits `code` (NaN for S.1111.111)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 7
    if exponent == 15 and mantissa == 7:
        return float("nan")
    if exponent == 0:
        return sign * mantissa / 8.0 * 2.0 ** -6
    return sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)


def e4m3_encode(x):
    """Nearest e4m3 codes of float32 `x` (|x| <= 448), ties to the even code."""
    positive = np.array([e4m3_value(c) for c in range(0x7F)], dtype=np.float64)  # Increasing.
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(positive, a), 1, len(positive) - 1)
    lo = hi - 1
    d_lo, d_hi = a - positive[lo], positive[hi] - a
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= positive[-1], len(positive) - 1, code)
    return (code | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def bf16_round(x):
    """float32 `x` rounded to bfloat16 (nearest, ties to even), as float32."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--block", type=int, nargs=2, default=[128, 128], metavar=("ROWS", "COLS"))
    p.add_argument("--scale-dtype", choices=["F32", "BF16"], default="F32")
    args = p.parse_args()
    rows_per, cols_per = args.block
    values_of = np.array([e4m3_value(c) for c in range(256)], dtype=np.float32)

    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    hf = read_safetensors(args.model)
    for d in (args.out, args.reference):
        os.makedirs(d, exist_ok=True)
    packed, reference = {}, {}
    for name in sorted(hf):
        values = hf[name].astype(np.float32)
        if not QUANTIZED.match(name):
            packed[name] = ("F32", values)
            reference[name] = ("F32", values)
            continue
        layer = name[:-len(".weight")]
        out_features, in_features = values.shape
        br, bc = -(-out_features // rows_per), -(-in_features // cols_per)
        scales = np.zeros((br, bc), dtype=np.float32)
        codes = np.zeros(values.shape, dtype=np.uint8)
        for i in range(br):
            for j in range(bc):
                block = values[i * rows_per:(i + 1) * rows_per, j * cols_per:(j + 1) * cols_per]
                scale = np.float32(np.abs(block).max() / np.float32(E4M3_MAX))
                if args.scale_dtype == "BF16":
                    scale = bf16_round(np.array([scale]))[0]
                scale = scale if scale > 0 else np.float32(1.0)
                scales[i, j] = scale
                codes[i * rows_per:(i + 1) * rows_per, j * cols_per:(j + 1) * cols_per] = \
                    e4m3_encode(np.clip(block / scale, -E4M3_MAX, E4M3_MAX))
        assert not np.any((codes & 0x7F) == 0x7F), name  # Never NaN.
        expanded = np.repeat(np.repeat(scales, rows_per, axis=0), cols_per, axis=1)
        dequantized = values_of[codes] * expanded[:out_features, :in_features]
        assert dequantized.dtype == np.float32
        error = np.sqrt(np.mean((dequantized - values) ** 2) / np.mean(values ** 2))
        if not error < 0.05:
            raise SystemExit(f"{name}: quantization error {error:.3g}")
        packed[name] = ("F8_E4M3", codes)
        if args.scale_dtype == "BF16":
            packed[layer + ".weight_scale_inv"] = (
                "BF16", (scales.view(np.uint32) >> 16).astype(np.uint16))
        else:
            packed[layer + ".weight_scale_inv"] = ("F32", scales)
        reference[name] = ("F32", dequantized)

    quantization = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [rows_per, cols_per]}
    copy_side_files(args.model, args.out, args.reference)
    with open(os.path.join(args.reference, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(dict(config, torch_dtype="bfloat16", quantization_config=quantization), f,
                  indent=2)
    write_safetensors(os.path.join(args.out, "model.safetensors"), packed)
    write_safetensors(os.path.join(args.reference, "model.safetensors"), reference)


if __name__ == "__main__":
    main()
