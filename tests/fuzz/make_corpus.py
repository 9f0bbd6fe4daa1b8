#!/usr/bin/env python3
"""Writes the fuzzers' committed inputs: the two small tokenizers they load at start-up
(tests/fuzz/data/) and the seed corpora (tests/fuzz/corpus/<target>/).

  tests/fuzz/make_corpus.py            # run from anywhere, with the test venv's Python

Needs HF's `tokenizers` (the test venv, scripts/install-deps.sh), numpy and spm_train
(tests/model_gen/make_test_model.py, for the real config.json files and safetensors
headers) and protoc (seeds are written as text protos here and encoded with it). All but
the llama2 tokenizer comes out byte for byte the same each run; `tokenizers` breaks ties
in that one's training in hash order, so its merges (and the llama2 seeds' ids) may
differ: the committed files are a consistent set, rerun only to change them.
Inputs that fuzzing found (fixed since) live beside the seeds as corpus/<target>/crash-*
and timeout-*: this script only rewrites the seed-* files.
"""

import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")
DATA = os.path.join(HERE, "data")
sys.path.insert(0, os.path.join(ROOT, "tests", "tokenizer_ref"))
# Parallel BPE training can break ties between equally frequent merges either way.
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import make_tokenizers  # noqa: E402  (tests/tokenizer_ref: the tokenizer recipes)

# Vocabularies small enough to commit (a few tens of KB) yet with real merges.
MAX_VOCAB = 400


def write(target, name, data):
    directory = os.path.join(CORPUS, target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def clear_seeds(target):
    for path in glob.glob(os.path.join(CORPUS, target, "seed-*")):
        os.remove(path)


# --- Tokenizers -------------------------------------------------------------------------

def make_tokenizer_files():
    """llama3 (byte-level BPE) and llama2 (Metaspace with byte fallback, HF's
    ByteFallback decoder), the two ways detokenization differs, from the recipes of
    tests/tokenizer_ref with the vocabulary capped."""
    full_train = make_tokenizers.train

    def small_train(tok, lines, vocab_size, *args, **kwargs):
        full_train(tok, lines, min(vocab_size, MAX_VOCAB), *args, **kwargs)

    make_tokenizers.train = small_train
    corpus = make_tokenizers.read_corpus(os.path.join(ROOT, "tests", "model_gen", "corpus.txt"))
    lines = make_tokenizers.training_lines(corpus)
    tokenizers = {}
    for name in ("llama3", "llama2"):
        data, config = make_tokenizers.TOKENIZERS[name](lines)
        directory = os.path.join(DATA, name)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)
        tokenizers[name] = make_tokenizers.Tokenizer.from_file(
            os.path.join(directory, "tokenizer.json"))
    make_tokenizers.train = full_train
    return tokenizers


# --- Protos -----------------------------------------------------------------------------

def encode_proto(message_type, proto_file, text):
    r = subprocess.run(["protoc", f"--encode={message_type}", f"-I{ROOT}/proto",
                        os.path.join(ROOT, "proto", proto_file)],
                       input=text.encode("utf-8"), stdout=subprocess.PIPE, check=True)
    return r.stdout


GENERATE_REQUESTS = {
    "text": 'text: "The capital of France is" max_new_tokens: 16',
    "text_sampling": 'text: "héllo wörld 你好 🚀" temperature: 0.7 top_k: 40 top_p: 0.9 '
                     'min_p: 0.05 repetition_penalty: 1.1 presence_penalty: 0.5 '
                     'frequency_penalty: -0.5 seed: 42 logprobs: 5 priority: 3',
    "text_no_bos": 'text: "<|begin_of_text|>already framed" add_bos: false',
    "token_ids": 'token_ids { ids: [1, 2, 3, 300, 17] } max_new_tokens: 8',
    "token_ids_bos": 'token_ids { ids: [5, 6] } add_bos: true ignore_eos: true',
    "stops": 'text: "count: 1, 2, 3" stop: ["4", ", 5", "🚀"] stop_token_ids: [7, 9] '
             'request_id: "req-1"',
    "greedy": 'text: "a" temperature: 0 max_new_tokens: 1',
    "too_long_output": 'text: "a" max_new_tokens: 100000',
    "bad_sampling": 'text: "a" temperature: -1 top_p: 1.5 logprobs: 50',
    "empty": '',
}


def make_generate_request_seeds():
    clear_seeds("generate_request_fuzzer")
    for name, text in GENERATE_REQUESTS.items():
        write("generate_request_fuzzer", f"seed-{name}",
              encode_proto("conveyor.v1.GenerateRequest", "conveyor.proto", text))


# The step fuzzer's input: a first byte whose low two bits choose Init (0) or steps, then
# for steps, StepRequests each behind its 2-byte little-endian length
# (tests/fuzz/step_request_fuzzer.cc).
INIT_REQUESTS = {
    "init": 'model_path: "/nonexistent/model" block_size: 16 kv_cache_bytes: 1048576',
    "init_tp": 'model_path: "m" tp_rank: 1 tp_world_size: 2 collective_id: "id"',
    "init_bad_rank": 'model_path: "m" tp_rank: 3 tp_world_size: 2',
    "init_bad_block": 'model_path: "m" block_size: 4096 max_step_tokens: -1',
}

STEP_SEQUENCES = {
    "prefill_decode": [
        'step_id: 1 new_sequences { seq_id: 1 token_ids: [1, 10, 20, 30] num_tokens: 4 '
        'block_ids: [0] sampling { temperature: 0 } }',
        'step_id: 2 running { seq_id: 1 num_tokens: 1 }',
        'step_id: 3 dropped_seq_ids: [1]',
    ],
    # Speculative decoding: drafts verified in a decode (some kept, some not, against the
    # tokens the tiny model samples), then more than the blocks hold.
    "drafts": [
        'step_id: 1 new_sequences { seq_id: 4 token_ids: [1, 10, 20, 30, 10, 20] num_tokens: 6 '
        'block_ids: [0, 1] sampling { temperature: 0.7 seed: 5 num_logprobs: 1 } }',
        'step_id: 2 running { seq_id: 4 num_tokens: 1 draft_token_ids: [30, 10, 20] }',
        'step_id: 3 running { seq_id: 4 num_tokens: 1 new_block_ids: [2] '
        'draft_token_ids: [10, 20, 30, 10, 20, 30, 10, 20, 30, 10, 20] }',
    ],
    # The draft model proposes after the prefill and after each decode; the proposals come
    # back as drafts, one shared-prefix sequence among them, and one asks for more than
    # its blocks hold slots for.
    "proposals": [
        'step_id: 1 new_sequences { seq_id: 5 token_ids: [1, 10, 20, 30, 40] num_tokens: 5 '
        'block_ids: [0, 1] sampling { temperature: 0 } num_tokens_to_propose: 3 }',
        'step_id: 2 running { seq_id: 5 num_tokens: 1 draft_token_ids: [10, 20] '
        'num_tokens_to_propose: 4 }',
        'step_id: 3 running { seq_id: 5 num_tokens: 1 new_block_ids: [2] draft_token_ids: [20] '
        'num_tokens_to_propose: 32 }',
    ],
    "chunked_prefill": [
        'step_id: 1 new_sequences { seq_id: 7 token_ids: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, '
        '12, 13, 14, 15, 16, 17, 18] num_tokens: 10 block_ids: [3] '
        'sampling { temperature: 0.8 top_k: 5 seed: 3 num_logprobs: 2 } }',
        'step_id: 2 running { seq_id: 7 num_tokens: 8 new_block_ids: [4] }',
        'step_id: 3 running { seq_id: 7 num_tokens: 1 }',
    ],
    "two_sequences_shared_prefix": [
        'step_id: 1 new_sequences { seq_id: 1 token_ids: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, '
        '12, 13, 14, 15, 16, 17] num_tokens: 17 block_ids: [0, 1] sampling { temperature: 0 } }',
        'step_id: 2 new_sequences { seq_id: 2 token_ids: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, '
        '13, 14, 15, 16, 40, 41] num_tokens: 2 num_cached_tokens: 16 block_ids: [0, 2] '
        'sampling { temperature: 1 top_p: 0.5 repetition_penalty: 1.2 } } '
        'running { seq_id: 1 num_tokens: 1 }',
    ],
    "preempted": [
        'step_id: 1 new_sequences { seq_id: 9 token_ids: [1, 2, 3, 100, 101] '
        'num_output_tokens: 2 num_tokens: 5 block_ids: [5] '
        'sampling { presence_penalty: 1 frequency_penalty: 0.5 } }',
    ],
    "reset": [
        'step_id: 1 new_sequences { seq_id: 1 token_ids: [1] num_tokens: 1 block_ids: [0] }',
        'step_id: 2 reset: true new_sequences { seq_id: 1 token_ids: [1] num_tokens: 1 '
        'block_ids: [0] }',
    ],
    # The first step found by fuzzing with a grammar (refused FAILED_PRECONDITION while the
    # fuzzed engine had no vocabulary); the second refuses output the grammar disallows.
    "grammar": [
        'step_id: 1 new_sequences { seq_id: 1 token_ids: [1, 104, 105] num_tokens: 3 '
        'block_ids: [0] grammar: "root ::= \\"{\\" [a-z]+ (\\",\\" [0-9]{1,3})* \\"}\\"" '
        'sampling { temperature: 0.7 seed: 5 } }',
        'step_id: 2 running { seq_id: 1 num_tokens: 1 }',
        'step_id: 3 new_sequences { seq_id: 2 token_ids: [1, 104, 33, 34] num_output_tokens: 2 '
        'num_tokens: 4 block_ids: [1] grammar: "root ::= [a-z]*" }',
    ],
    "bad_block": [
        'step_id: 1 new_sequences { seq_id: 1 token_ids: [1, 2] num_tokens: 2 '
        'block_ids: [100000] }',
    ],
}


def make_step_request_seeds():
    clear_seeds("step_request_fuzzer")
    for name, text in INIT_REQUESTS.items():
        write("step_request_fuzzer", f"seed-{name}",
              b"\x00" + encode_proto("conveyor.worker.v1.InitRequest", "worker.proto", text))
    for name, steps in STEP_SEQUENCES.items():
        data = b"\x01"
        for text in steps:
            step = encode_proto("conveyor.worker.v1.StepRequest", "worker.proto", text)
            data += struct.pack("<H", len(step)) + step
        write("step_request_fuzzer", f"seed-{name}", data)


# --- Model files ------------------------------------------------------------------------

MODEL_VARIANTS = {
    "llama3_gqa": ["--rope-scaling", "llama3"],
    "tied_bf16_sharded": ["--tie-embeddings", "--num-kv-heads", "4", "--dtype", "bf16",
                          "--shards", "3", "--rope-scaling", "linear"],
    "qwen2_bias_f16": ["--model-type", "qwen2", "--dtype", "f16"],
    "mistral": ["--model-type", "mistral"],
}


def safetensors_image(header, data_bytes):
    header_json = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return struct.pack("<Q", len(header_json)) + header_json + bytes(data_bytes)


def shrunk(header):
    """The real header with every dimension cut to at most 2 and the offsets redone, so
    the file holds all its tensors in a few hundred bytes."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2}
    out, offset = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            out[name] = entry
            continue
        shape = [min(d, 2) for d in entry["shape"]]
        n = sizes[entry["dtype"]]
        for d in shape:
            n *= d
        out[name] = {"dtype": entry["dtype"], "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    return out, offset


def make_model_seeds():
    clear_seeds("model_config_fuzzer")
    clear_seeds("safetensors_fuzzer")
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in MODEL_VARIANTS.items():
            out = os.path.join(tmp, name)
            subprocess.run(["/usr/bin/python3",
                            os.path.join(ROOT, "tests", "model_gen", "make_test_model.py"),
                            "--preset", "tiny", "--out", out, "--seed", "1"] + flags,
                           check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(out, "config.json"), "rb") as f:
                write("model_config_fuzzer", f"seed-{name}", f.read())
            for path in sorted(glob.glob(os.path.join(out, "*.safetensors")))[:1]:
                with open(path, "rb") as f:
                    image = f.read()
                (length,) = struct.unpack("<Q", image[:8])
                header = json.loads(image[8:8 + length])
                small, data_bytes = shrunk(header)
                write("safetensors_fuzzer", f"seed-{name}", safetensors_image(small, data_bytes))
                # The real header, its data cut short: truncation is caught per tensor.
                write("safetensors_fuzzer", f"seed-{name}-truncated", image[:8 + length + 64])
    edge = {
        "empty_header": safetensors_image({}, 0),
        "metadata_only": safetensors_image({"__metadata__": {"format": "pt"}}, 0),
        "scalar_and_empty": safetensors_image(
            {"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
             "e": {"dtype": "BF16", "shape": [0, 3], "data_offsets": [4, 4]}}, 4),
        "unknown_dtype": safetensors_image(
            {"i": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]},
             "f": {"dtype": "F16", "shape": [1, 2], "data_offsets": [16, 20]}}, 20),
        "header_too_long": struct.pack("<Q", 1 << 40) + b"{}",
    }
    for name, data in edge.items():
        write("safetensors_fuzzer", f"seed-{name}", data)
    configs = {
        "minimal": {"vocab_size": 8, "hidden_size": 4, "intermediate_size": 8,
                    "num_hidden_layers": 1, "num_attention_heads": 1},
        "eos_list_sliding_window": {
            "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32,
            "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 4096,
            "sliding_window": 1024, "eos_token_id": [2, 3], "bos_token_id": None},
        "huge_dims": {"vocab_size": 2147483647, "hidden_size": 2147483647,
                      "intermediate_size": 2147483647, "num_hidden_layers": 2147483647,
                      "num_attention_heads": 1},
        "not_an_object": [1, 2, 3],
    }
    for name, config in configs.items():
        write("model_config_fuzzer", f"seed-{name}", json.dumps(config))


# --- Detokenizer ------------------------------------------------------------------------

# The detokenizer fuzzer's input (tests/fuzz/detokenizer_fuzzer.cc): a first byte whose
# low bit picks the tokenizer (0 llama3, 1 llama2) and whose next three bits are how many
# of the ids are prompt, then token ids as 2-byte little-endian values (modulo the vocab,
# plus a few past it).
DETOKENIZER_TEXTS = ["héllo wörld 你好 🚀", "the quick brown fox", "  two  spaces,\nnew line\t",
                     "naïve café, 你好吗?", "🚀🤖 ok", "<|eot_id|> [INST] x [/INST]"]


def make_detokenizer_seeds(tokenizers):
    clear_seeds("detokenizer_fuzzer")
    for selector, name in enumerate(("llama3", "llama2")):
        tok = tokenizers[name]
        for i, text in enumerate(DETOKENIZER_TEXTS):
            ids = tok.encode(text, add_special_tokens=False).ids
            prompt = min(i % 4, len(ids))
            data = bytes([selector | prompt << 1]) + b"".join(struct.pack("<H", t) for t in ids)
            write("detokenizer_fuzzer", f"seed-{name}-{i}", data)
    # llama2's byte tokens <0x00>..<0xFF> are ids 3..258: a rocket split over them, a
    # character cut short and a stray continuation byte.
    rocket = [3 + b for b in "🚀".encode("utf-8")]
    for name, ids in {"bytes_rocket": rocket + [3 + ord("a")],
                      "bytes_cut": [3 + 0xE4, 3 + 0xBD],
                      "bytes_stray": [3 + ord("a"), 3 + 0xC3, 3 + 0xA9, 3 + 0xA9, 3 + ord("b")]
                      }.items():
        data = b"\x01" + b"".join(struct.pack("<H", t) for t in ids)
        write("detokenizer_fuzzer", f"seed-llama2-{name}", data)


# --- HTTP request bodies ----------------------------------------------------------------


def make_http_request_seeds():
    """The HTTP request fuzzer's input: one byte picking the endpoint (modulo 4: completions,
    chat, responses, messages), then the body."""
    clear_seeds("http_request_fuzzer")
    completions = {
        "text": {"model": "tiny", "prompt": "Hello there", "max_tokens": 8},
        "ids": {"prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 2, "stream": True,
                "stream_options": {"include_usage": True}},
        "sampling": {"prompt": "a", "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": -3,
                     "stop": ["\n", "END"], "presence_penalty": 0.5, "min_p": 0.1},
        "batch_of_one": {"prompt": ["x"], "echo": False, "n": 1, "logit_bias": {}},
        "bad_types": {"prompt": "a", "max_tokens": "8", "stream": "yes", "logprobs": 1e9},
        "choices_echo": {"prompt": "a b", "n": 3, "echo": True, "logprobs": 1, "seed": 4,
                         "logit_bias": {"5": -100}},
    }
    responses = {
        "items": {"input": [{"role": "developer", "content": "Be brief."},
                            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                            {"type": "function_call", "call_id": "c1", "name": "f",
                             "arguments": "{}"},
                            {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
                  "instructions": "x", "max_output_tokens": 8, "stream": True,
                  "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                  "text": {"format": {"type": "json_schema", "name": "s",
                                      "schema": {"type": "object"}}}},
        "stateful": {"input": "hi", "previous_response_id": "resp_1"},
    }
    messages = {
        "blocks": {"max_tokens": 8, "system": "Be brief.", "stop_sequences": ["\n"],
                   "messages": [{"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": [
                                    {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                                {"role": "user", "content": [
                                    {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}],
                   "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                   "tool_choice": {"type": "any"}, "thinking": {"type": "disabled"}},
        "no_max_tokens": {"messages": [{"role": "user", "content": "Hi"}]},
    }
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    chats = {
        "plain": {"messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Hi"}], "max_tokens": 8},
        "tools": {"messages": [{"role": "user", "content": "Weather in Paris?"},
                               {"role": "assistant", "content": None, "tool_calls": [
                                   {"id": "c1", "type": "function", "function": {
                                       "name": "get_weather",
                                       "arguments": "{\"city\": \"Paris\"}"}}]},
                               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
                  "tools": tools, "tool_choice": "auto"},
        "parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]}],
                  "logprobs": True, "top_logprobs": 3, "response_format": {"type": "text"}},
        "bad_role": {"messages": [{"role": "wizard", "content": "x"}]},
    }
    for name, body in completions.items():
        write("http_request_fuzzer", f"seed-completions-{name}", b"\x00" + json.dumps(body).encode())
    for name, body in chats.items():
        write("http_request_fuzzer", f"seed-chat-{name}", b"\x01" + json.dumps(body).encode())
    for name, body in responses.items():
        write("http_request_fuzzer", f"seed-responses-{name}", b"\x02" + json.dumps(body).encode())
    for name, body in messages.items():
        write("http_request_fuzzer", f"seed-messages-{name}", b"\x03" + json.dumps(body).encode())
    deep = "[" * 70 + "]" * 70
    write("http_request_fuzzer", "seed-deep", b"\x00" + f'{{"prompt": [1, {deep}]}}'.encode())
    write("http_request_fuzzer", "seed-not-json", b"\x01" + b'{"messages": [')


def main():
    if shutil.which("protoc") is None:
        sys.exit("protoc not found (scripts/install-deps.sh)")
    tokenizers = make_tokenizer_files()
    make_generate_request_seeds()
    make_step_request_seeds()
    make_model_seeds()
    make_detokenizer_seeds(tokenizers)
    make_http_request_seeds()
    print(f"fuzz corpus written under {CORPUS}")


if __name__ == "__main__":
    main()
