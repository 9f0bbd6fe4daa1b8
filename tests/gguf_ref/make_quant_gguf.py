"""Writes a small random Llama model as a GGUF file of block-quantized weights, for the
quantized-kernel tests (tests/worker/gguf_quant_model_test.cc) and benchmarks.

--type q8_0: every layer matrix and the embedding in Q8_0 (the gguf package's quantizer).
--type q4_k_m: llama.cpp's Q4_K_M mix: attn_v and ffn_down (and the output matrix) Q6_K,
the other matrices Q4_K. The gguf package cannot quantize K types, so this file does,
with a simple quantizer of its own (min/max per sub-block, 6-bit scales by the largest);
every tensor is checked by dequantizing it with gguf.quants.dequantize (llama.cpp's
reference) against the float values it came from.

Shapes are multiples of 256 (K blocks run along rows of 256). Norm weights stay F32.

--tokenizer-corpus TEXT adds a sentencepiece-style vocabulary of exactly --vocab tokens, as
convert_hf_to_gguf writes a Llama-2 tokenizer.model (tokenizer.ggml.model "llama": <unk> <s>
</s>, the 256 <0xNN> byte tokens, then pieces of a BPE trained with `tokenizers` on the
text's Metaspace words, scored -rank; no merges), so llama.cpp's llama-server and
Conveyor's scheduler can serve the file (bench/llamacpp/). Without it the file has no
tokenizer, which the kernel tests and quant_decode_bench do not need.
"""
import argparse

import gguf
import numpy as np

T = gguf.GGMLQuantizationType


def q4_k(x):
    """Q4_K blocks of x [rows, cols] as uint8 [rows, cols / 256 * 144]."""
    rows, cols = x.shape
    sb = x.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(sb.min(axis=2), 0.0)
    hi = sb.max(axis=2)
    scale = (hi - lo) / 15.0
    d = np.maximum(scale.max(axis=1), 1e-12) / 63.0
    dmin = np.maximum((-lo).max(axis=1), 1e-12) / 63.0
    d16 = d.astype(np.float16)
    dmin16 = dmin.astype(np.float16)
    sc = np.clip(np.rint(scale / d16.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(-lo / dmin16.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    step = d16.astype(np.float32)[:, None] * sc
    offset = dmin16.astype(np.float32)[:, None] * mn
    q = np.where(step[:, :, None] > 0,
                 np.rint((sb + offset[:, :, None]) / np.where(step > 0, step, 1)[:, :, None]), 0)
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, 128)
    scales = np.zeros((sb.shape[0], 12), np.uint8)
    for j in range(4):
        scales[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        scales[:, j + 4] = (mn[:, j] & 63) | ((mn[:, j + 4] >> 4) << 6)
        scales[:, j + 8] = (sc[:, j + 4] & 15) | ((mn[:, j + 4] & 15) << 4)
    blocks = np.concatenate([d16.view(np.uint8).reshape(-1, 2), dmin16.view(np.uint8).reshape(-1, 2),
                             scales, qs], axis=1)
    return blocks.reshape(rows, -1)


def q6_k(x):
    """Q6_K blocks of x [rows, cols] as uint8 [rows, cols / 256 * 210]."""
    rows, cols = x.shape
    sb = x.reshape(-1, 16, 16).astype(np.float32)
    sub = np.abs(sb).max(axis=2) / 31.0
    d = np.maximum(sub.max(axis=1), 1e-12) / 127.0
    d16 = d.astype(np.float16)
    sc = np.clip(np.rint(sub / d16.astype(np.float32)[:, None]), -128, 127).astype(np.int8)
    step = d16.astype(np.float32)[:, None] * sc
    q = np.where(step[:, :, None] != 0,
                 np.rint(sb / np.where(step != 0, step, 1)[:, :, None]), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4),
                         (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)], axis=2).reshape(-1, 128)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4)
          | ((q[:, :, 3] >> 4) << 6)).reshape(-1, 64)
    blocks = np.concatenate([ql, qh, sc.view(np.uint8), d16.view(np.uint8).reshape(-1, 2)],
                            axis=1)
    return blocks.reshape(rows, -1)


def add_spm_tokenizer(w, corpus_path, vocab_size):
    """tokenizer.ggml.* for a sentencepiece-style vocabulary of vocab_size tokens trained on
    the lines of corpus_path (pieces the training does not fill are UNUSED padding)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    with open(corpus_path, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    if vocab_size <= len(specials):
        raise SystemExit(f"--vocab {vocab_size} leaves no room for pieces after the byte tokens")
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.train_from_iterator(lines, trainer=trainers.BpeTrainer(
        vocab_size=vocab_size - len(specials), show_progress=False, limit_alphabet=200))
    tt = gguf.TokenType
    tokens = list(specials)
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL] + [tt.BYTE] * 256
    scores = [0.0] * len(tokens)
    for rank, (piece, _) in enumerate(sorted(trained.get_vocab().items(), key=lambda kv: kv[1])):
        if piece in specials or len(tokens) == vocab_size:
            continue
        tokens.append(piece)
        types.append(tt.NORMAL)
        scores.append(-float(rank))
    while len(tokens) < vocab_size:
        tokens.append(f"<unused{len(tokens)}>")
        types.append(tt.UNUSED)
        scores.append(-1e9)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_bool("tokenizer.ggml.add_space_prefix", True)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--type", choices=["q8_0", "q4_k_m"], required=True)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-corpus", help="text to train a vocabulary of --vocab tokens on")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    h, ffn, head_dim = args.hidden, args.ffn, args.hidden // args.heads

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_block_count(args.layers)
    w.add_context_length(2048)
    w.add_embedding_length(h)
    w.add_feed_forward_length(ffn)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if args.tokenizer_corpus:
        add_spm_tokenizer(w, args.tokenizer_corpus, args.vocab)

    def add(name, shape, kind="q4_k", scale=None):
        if len(shape) == 1:
            w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            return
        values = (rng.standard_normal(shape) * (scale or shape[1] ** -0.5)).astype(np.float32)
        if args.type == "q8_0":
            qtype, blocks = T.Q8_0, gguf.quants.quantize(values, T.Q8_0)
        elif kind == "q6_k":
            qtype, blocks = T.Q6_K, q6_k(values)
        else:
            qtype, blocks = T.Q4_K, q4_k(values)
        # The blocks must say what was meant: llama.cpp's dequantization, back to the values
        # within the quantizer's step (a packing error would be off by whole scales).
        back = gguf.quants.dequantize(blocks, qtype).reshape(shape)
        error = np.sqrt(np.mean((back - values) ** 2) / np.mean(values ** 2))
        limit = {T.Q8_0: 0.01, T.Q6_K: 0.04, T.Q4_K: 0.12}[qtype]
        if not error < limit:
            raise SystemExit(f"{name}: {qtype.name} round trip error {error:.3g} >= {limit}")
        w.add_tensor(name, blocks, raw_dtype=qtype)

    add("token_embd.weight", (args.vocab, h), scale=1.0)
    add("output_norm.weight", (h,))
    add("output.weight", (args.vocab, h), "q6_k")
    for i in range(args.layers):
        blk = f"blk.{i}."
        add(blk + "attn_norm.weight", (h,))
        add(blk + "ffn_norm.weight", (h,))
        add(blk + "attn_q.weight", (args.heads * head_dim, h))
        add(blk + "attn_k.weight", (args.kv_heads * head_dim, h))
        add(blk + "attn_v.weight", (args.kv_heads * head_dim, h), "q6_k")
        add(blk + "attn_output.weight", (h, args.heads * head_dim))
        add(blk + "ffn_gate.weight", (ffn, h))
        add(blk + "ffn_up.weight", (ffn, h))
        add(blk + "ffn_down.weight", (h, ffn), "q6_k")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
