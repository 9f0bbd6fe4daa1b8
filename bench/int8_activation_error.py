#!/usr/bin/env python3
"""What quantizing activations to int8 would cost, on the test models.

For each test checkpoint this runs the independent float64 reference
(tests/reference/llama_ref.py) three ways over its prompts and prints the largest
relative logit error (||logits - exact|| / ||exact|| at any position) of:

  w8    int8 weights (symmetric, per output channel, as the CPU worker packs them),
        activations exact: what --cpu_weight_dtype=int8 computes;
  w8a8  the same weights, and every linear layer's input quantized to int8 per row
        (symmetric, scale = max|x| / 127): what a VNNI / AMX-INT8 GEMM would need.

Usage: bench/int8_activation_error.py [--testdata DIR]   (default build/tests/testdata,
which ctest's fixture writes). Needs numpy (Debian's python3 has it).
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
import llama_ref  # noqa: E402

EXACT_LINEAR = llama_ref.linear


def quantize_rows(a):
    """Symmetric int8 per row of `a` (last axis), returned dequantized."""
    scale = np.abs(a).max(axis=-1, keepdims=True) / 127.0
    scale[scale == 0] = 1.0
    return np.clip(np.rint(a / scale), -127, 127) * scale


def quantized_linear(quantize_activations, cache):
    def linear(x, weights, prefix):
        if prefix not in cache:
            cache[prefix] = quantize_rows(weights[prefix + ".weight"])
        if quantize_activations:
            x = quantize_rows(x)
        y = x @ cache[prefix].T
        bias = weights.get(prefix + ".bias")
        return y if bias is None else y + bias

    return linear


def worst_error(cfg, weights, prompts, linear):
    worst = 0.0
    for prompt in prompts:
        llama_ref.linear = EXACT_LINEAR
        exact = llama_ref.forward(cfg, weights, prompt)
        llama_ref.linear = linear
        got = llama_ref.forward(cfg, weights, prompt)
        err = np.linalg.norm(got - exact, axis=-1) / np.linalg.norm(exact, axis=-1)
        worst = max(worst, float(err.max()))
    llama_ref.linear = EXACT_LINEAR
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--testdata", default=os.path.join(HERE, "..", "build", "tests", "testdata"))
    args = parser.parse_args()
    variants = sorted(
        v for v in os.listdir(args.testdata) if os.path.exists(os.path.join(args.testdata, v, "prompts.json"))
    )
    if not variants:
        sys.exit(f"no test models in {args.testdata}; run ctest (or tests/make_test_data.sh) first")
    print(f"{'variant':<24} {'w8':>8} {'w8a8':>8} {'ratio':>6}")
    for variant in variants:
        model_dir = os.path.join(args.testdata, variant)
        cfg, weights = llama_ref.load_model(model_dir)
        with open(os.path.join(model_dir, "prompts.json")) as f:
            prompts = json.load(f)
        w8 = worst_error(cfg, weights, prompts, quantized_linear(False, {}))
        w8a8 = worst_error(cfg, weights, prompts, quantized_linear(True, {}))
        print(f"{variant:<24} {w8:8.3g} {w8a8:8.3g} {w8a8 / w8:6.2f}")


if __name__ == "__main__":
    main()
