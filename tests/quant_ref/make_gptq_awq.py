#!/usr/bin/env python3
"""Writes a Hugging Face test checkpoint (tests/make_test_data.sh's variants) as a GPTQ or
AWQ checkpoint, with an independent numpy reference, for tests/worker/gptq_awq_model_test.cc.

  make_gptq_awq.py --model SRC --out DIR --reference REF_DIR --expected EXP_DIR
                   --method gptq|awq [--bits 4|8] [--group-size N] [--asym]
                   [--checkpoint-format gptq|gptq_v2] [--desc-act] [--permute-g-idx]

Every linear layer of the decoder layers (`*_proj.weight`, Mixtral's `w1/w2/w3`) is
quantized round-to-nearest per group of --group-size inputs of one output (GPTQ's
Quantizer.find_params without the Hessian: the layout is what is tested, not GPTQ's
accuracy), and written as the formats store it:

  GPTQ (AutoGPTQ's QuantLinear.pack): qweight int32 [in / (32/bits), out], `32/bits`
    consecutive inputs of one output per word, input i at bits (i % (32/bits))·bits;
    qzeros int32 [groups, out / (32/bits)] packed the same way along outputs, each zero
    point minus one in checkpoint_format "gptq" (v1), as it is in "gptq_v2"; scales fp16
    [groups, out]; g_idx int32 [in] = i // group_size with --desc-act (--permute-g-idx
    swaps two inputs' groups: a real act-order permutation, which Conveyor refuses).
  AWQ (AutoAWQ's WQLinear_GEMM.from_linear): qweight int32 [in, out / 8], the 8 outputs
    8c..8c+7 of one input in word c, nibble k holding output 8c + [0, 2, 4, 6, 1, 3, 5, 7][k];
    qzeros int32 [groups, out / 8] the same way; scales fp16 [groups, out].

The rest (embeddings, norms, lm_head, biases) is copied as float32. config.json gains the
quantization_config transformers writes.

REF_DIR gets the same checkpoint with each quantized layer's weight as this script's own
dequantization, written from the format descriptions above (not from the packing code):
the bits are unpacked again from the int32 words, then w = float32(scale)·(q − zero), which
is exact in float32. The C++ reader must give these values bit for bit.

EXP_DIR gets, per quantized weight, the ggml blocks Conveyor must hand out
(`<name>.blocks`: Q4_0 where every zero point of the layer is 8, else Q4_1 for 4 bits,
Q8_0 for 8 bits; d = scale, m = fp16(−scale·zero)) and `expected.json` (type and shape of
each). The blocks are checked here against the `gguf` package's dequantization: equal to
the reference for Q4_0 and Q8_0; for Q4_1 every weight of a block off by exactly
m − (−scale·zero), at most 2^-11·scale·zero.
"""
import argparse
import json
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gguf_ref"))
from hf_to_gguf import read_safetensors  # noqa: E402

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # Nibble k of a word holds output AWQ_ORDER[k].
QUANTIZED = re.compile(r"^model\.layers\..*(_proj|\.w[123])\.weight$")


def write_safetensors(path, tensors):
    """`tensors`: name -> numpy array (float32, float16 or int32), or (safetensors dtype,
    numpy array of that element size) for the others (F8_E4M3, BF16)."""
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        value = tensors[name]
        dtype, array = value if isinstance(value, tuple) else (names[value.dtype], value)
        array = np.ascontiguousarray(array)
        raw = array.tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def copy_side_files(model, *dirs):
    """Copies the tokenizer and the like from `model` into each of `dirs`: not the weights,
    the config, nor the source's reference outputs."""
    for name in os.listdir(model):
        if name.endswith(".safetensors") or name in ("config.json", "model.safetensors.index.json",
                                                     "reference.json", "prompts.json"):
            continue
        source = os.path.join(model, name)
        if os.path.isfile(source):
            for d in dirs:
                shutil.copy(source, d)


def quantize(w, bits, group, sym, min_zero):
    """Round-to-nearest per group: q [out, in] (0..2^bits-1), zero and fp16 scale [out, groups]."""
    out_features, in_features = w.shape
    maxq = 2 ** bits - 1
    groups = -(-in_features // group)
    q = np.zeros(w.shape, np.int64)
    zero = np.zeros((out_features, groups), np.int64)
    scale = np.zeros((out_features, groups), np.float16)
    for g in range(groups):
        x = w[:, g * group:(g + 1) * group].astype(np.float64)
        xmin = np.minimum(x.min(axis=1), 0)
        xmax = np.maximum(x.max(axis=1), 0)
        if sym:
            xmax = np.maximum(-xmin, xmax)
            xmin = np.where(xmin < 0, -xmax, 0)
        both = (xmin == 0) & (xmax == 0)
        xmin, xmax = np.where(both, -1, xmin), np.where(both, 1, xmax)
        s = ((xmax - xmin) / maxq).astype(np.float16)
        z = (np.full(out_features, (maxq + 1) // 2) if sym
             else np.clip(np.round(-xmin / s.astype(np.float64)), min_zero, maxq).astype(np.int64))
        q[:, g * group:(g + 1) * group] = np.clip(
            np.round(x / s.astype(np.float64)[:, None]) + z[:, None], 0, maxq)
        zero[:, g], scale[:, g] = z, s
    return q, zero, scale


def pack_gptq(q, zero, bits, offset):
    """(qweight [in/pack, out], qzeros [groups, out/pack]) as int32."""
    pack = 32 // bits
    mask = 2 ** bits - 1
    intweight = q.T.astype(np.uint64)  # [in, out]
    qweight = np.zeros((intweight.shape[0] // pack, intweight.shape[1]), np.uint64)
    for j in range(pack):
        qweight |= intweight[j::pack] << np.uint64(bits * j)
    stored = ((zero.T - offset) & mask).astype(np.uint64)  # [groups, out]
    qzeros = np.zeros((stored.shape[0], stored.shape[1] // pack), np.uint64)
    for j in range(pack):
        qzeros |= stored[:, j::pack] << np.uint64(bits * j)
    return qweight.astype(np.uint32).view(np.int32), qzeros.astype(np.uint32).view(np.int32)


def pack_awq(q, zero):
    """(qweight [in, out/8], qzeros [groups, out/8]) as int32."""
    def interleave(values):  # [rows, out] -> [rows, out/8]
        values = values.astype(np.uint64)
        packed = np.zeros((values.shape[0], values.shape[1] // 8), np.uint64)
        for k, column in enumerate(AWQ_ORDER):
            packed |= values[:, column::8] << np.uint64(4 * k)
        return packed.astype(np.uint32).view(np.int32)
    return interleave(q.T), interleave(zero.T)


def reference_gptq(qweight, qzeros, scales, g_idx, bits, offset):
    """Dequantized [out, in] float32, unpacked bit by bit from the format description."""
    pack, mask = 32 // bits, 2 ** bits - 1
    words = qweight.view(np.uint32).astype(np.int64)
    in_features = words.shape[0] * pack
    i = np.arange(in_features)
    q = (words[i // pack, :] >> (bits * (i % pack))[:, None]) & mask  # [in, out]
    zwords = qzeros.view(np.uint32).astype(np.int64)
    o = np.arange(scales.shape[1])
    zero = ((zwords[:, o // pack] >> (bits * (o % pack))[None, :]) & mask) + offset  # [groups, out]
    value = scales.astype(np.float32)[g_idx, :] * (q - zero[g_idx, :]).astype(np.float32)
    return np.ascontiguousarray(value.T), q.T, zero.T


def reference_awq(qweight, qzeros, scales, group):
    shift = np.array([4 * AWQ_ORDER.index(c) for c in range(8)])  # Output c's nibble.
    words = qweight.view(np.uint32).astype(np.int64)
    o = np.arange(words.shape[1] * 8)
    q = (words[:, o // 8] >> shift[o % 8][None, :]) & 15  # [in, out]
    zero = (qzeros.view(np.uint32).astype(np.int64)[:, o // 8] >> shift[o % 8][None, :]) & 15
    g_idx = np.arange(words.shape[0]) // group
    value = scales.astype(np.float32)[g_idx, :] * (q - zero[g_idx, :]).astype(np.float32)
    return np.ascontiguousarray(value.T), q.T, zero.T


def ggml_blocks(q, zero, scales, group, bits):
    """The blocks Conveyor maps a layer to: (type name, uint8 [out, in/32 * block bytes])."""
    out_features, in_features = q.shape
    block_group = (np.arange(in_features // 32) * 32) // group  # Each block's group.
    d = np.ascontiguousarray(scales.T[:, block_group])  # [out, blocks] fp16
    z = zero[:, block_group]
    qb = q.reshape(out_features, -1, 32)
    if bits == 8:
        assert (zero == 128).all()
        body = (qb - 128).astype(np.int8).view(np.uint8)
        parts, qtype = [d.view(np.uint8).reshape(out_features, -1, 2), body], "Q8_0"
    else:
        nibbles = (qb[:, :, :16] | (qb[:, :, 16:] << 4)).astype(np.uint8)
        if (zero == 8).all():
            parts, qtype = [d.view(np.uint8).reshape(out_features, -1, 2), nibbles], "Q4_0"
        else:
            m = (-(d.astype(np.float32) * z.astype(np.float32))).astype(np.float16)
            parts = [d.view(np.uint8).reshape(out_features, -1, 2),
                     m.view(np.uint8).reshape(out_features, -1, 2), nibbles]
            qtype = "Q4_1"
    return qtype, np.concatenate(parts, axis=2).reshape(out_features, -1)


def check_blocks(name, qtype, blocks, reference, q, zero, scales, group):
    """The blocks, dequantized by the gguf package (llama.cpp's reference), against `reference`."""
    import gguf
    values = gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, qtype))
    values = values.reshape(reference.shape).astype(np.float32)
    if qtype != "Q4_1":
        if not np.array_equal(values.view(np.uint32), reference.view(np.uint32)):
            raise SystemExit(f"{name}: {qtype} blocks do not dequantize to the reference")
        return 0.0
    block_group = (np.arange(q.shape[1]) // 32 * 32) // group
    s = scales.T[:, block_group].astype(np.float64)  # Per weight, its block's scale.
    z = zero[:, block_group].astype(np.float64)
    m = (-(s.astype(np.float32) * z.astype(np.float32))).astype(np.float16).astype(np.float64)
    delta = values.astype(np.float64) - reference.astype(np.float64)
    if not np.array_equal(delta, m + s * z):  # Exactly m's rounding, nothing else.
        raise SystemExit(f"{name}: Q4_1 blocks are off by more than m's rounding")
    if not (np.abs(delta) <= 2.0 ** -11 * s * z).all():
        raise SystemExit(f"{name}: m's rounding exceeds 2^-11 scale zero")
    return float((np.abs(delta) / s).max())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--expected", required=True)
    p.add_argument("--method", choices=["gptq", "awq"], required=True)
    p.add_argument("--bits", type=int, choices=[4, 8], default=4)
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--asym", action="store_true", help="GPTQ: zero points (AWQ always has them)")
    p.add_argument("--checkpoint-format", choices=["gptq", "gptq_v2"], default="gptq")
    p.add_argument("--desc-act", action="store_true", help="GPTQ: desc_act true, g_idx written")
    p.add_argument("--permute-g-idx", action="store_true",
                   help="GPTQ: g_idx with two inputs' groups swapped (implies --desc-act)")
    args = p.parse_args()
    gptq = args.method == "gptq"
    if not gptq and (args.bits != 4 or args.asym or args.desc_act or args.permute_g_idx):
        raise SystemExit("AWQ is 4-bit with zero points, without g_idx")
    sym = gptq and not args.asym
    offset = 1 if gptq and args.checkpoint_format == "gptq" else 0
    desc_act = args.desc_act or args.permute_g_idx

    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    hf = read_safetensors(args.model)
    for d in (args.out, args.reference, args.expected):
        os.makedirs(d, exist_ok=True)
    packed, reference, expected = {}, {}, {}
    worst_m_steps = 0.0
    for name in sorted(hf):
        values = hf[name].astype(np.float32)
        if not QUANTIZED.match(name):
            packed[name] = reference[name] = values
            continue
        layer = name[:-len(".weight")]
        out_features, in_features = values.shape
        group = in_features if args.group_size == -1 else args.group_size
        # A v1 zero point of 0 would be stored as -1 (all ones), which readers decode
        # differently (Conveyor refuses it): the writer keeps zero points >= 1 there.
        q, zero, scales16 = quantize(values, args.bits, group, sym, 1 if offset else 0)
        scales = np.ascontiguousarray(scales16.T)  # [groups, out]
        g_idx = (np.arange(in_features) // group).astype(np.int32)
        if gptq:
            qweight, qzeros = pack_gptq(q, zero, args.bits, offset)
            packed[layer + ".qweight"], packed[layer + ".qzeros"] = qweight, qzeros
            packed[layer + ".scales"] = scales
            if desc_act:
                stored_g_idx = g_idx.copy()
                if args.permute_g_idx and stored_g_idx[-1] != stored_g_idx[0]:
                    stored_g_idx[[0, -1]] = stored_g_idx[[-1, 0]]
                packed[layer + ".g_idx"] = stored_g_idx
            dequantized, q2, zero2 = reference_gptq(qweight, qzeros, scales, g_idx, args.bits,
                                                     offset)
        else:
            qweight, qzeros = pack_awq(q, zero)
            packed[layer + ".qweight"], packed[layer + ".qzeros"] = qweight, qzeros
            packed[layer + ".scales"] = scales
            dequantized, q2, zero2 = reference_awq(qweight, qzeros, scales, group)
        # The unpacking read back what was packed (else the packer and the reader share a bug
        # nowhere else visible).
        assert np.array_equal(q2, q) and np.array_equal(zero2, zero), name
        reference[name] = dequantized
        error = np.sqrt(np.mean((dequantized - values) ** 2) / np.mean(values ** 2))
        if not error < (0.01 if args.bits == 8 else 0.2):
            raise SystemExit(f"{name}: quantization error {error:.3g}")
        if in_features % 32 == 0:
            qtype, blocks = ggml_blocks(q, zero, scales, group, args.bits)
            worst_m_steps = max(worst_m_steps, check_blocks(name, qtype, blocks, dequantized, q,
                                                            zero, scales, group))
            blocks.tofile(os.path.join(args.expected, name + ".blocks"))
            expected[name] = {"type": qtype, "shape": [out_features, in_features]}

    quantization = ({"quant_method": "gptq", "bits": args.bits, "group_size": args.group_size,
                     "desc_act": desc_act, "sym": sym, "checkpoint_format": args.checkpoint_format,
                     "damp_percent": 0.01, "true_sequential": True, "static_groups": False,
                     "model_name_or_path": None, "model_file_base_name": "model"} if gptq else
                    {"quant_method": "awq", "bits": 4, "group_size": args.group_size,
                     "zero_point": True, "version": "gemm", "modules_to_not_convert": None})
    copy_side_files(args.model, args.out, args.reference)
    with open(os.path.join(args.reference, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(dict(config, torch_dtype="float16", quantization_config=quantization), f, indent=2)
    write_safetensors(os.path.join(args.out, "model.safetensors"), packed)
    write_safetensors(os.path.join(args.reference, "model.safetensors"), reference)
    with open(os.path.join(args.expected, "expected.json"), "w") as f:
        json.dump({"tensors": expected, "worst_m_error_in_steps": worst_m_steps}, f, indent=2)


if __name__ == "__main__":
    main()
