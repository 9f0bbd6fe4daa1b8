#!/usr/bin/env python3
"""Records (or checks) Hugging Face transformers' logits for the test checkpoints.

The numpy reference (llama_ref.py) and Conveyor are both written from reading HF's
code; this script runs HF itself, once, on the checkpoints that tests/make_test_data.sh
builds, and stores small fixtures in tests/reference/hf_fixtures/<variant>.json. It
needs torch and transformers (tests/reference/README.md says which versions and how to
install them); CI does not: CI only reads the committed fixtures.

Each fixture holds: the transformers and torch versions, the command, the sha256 of
config.json and of every safetensors file (a mismatch means the generator's output
changed and the fixture must be re-recorded), and per prompt of prompts.json its token
ids, the float32 logits of its last few positions (9 significant digits) and 32 greedy
tokens (each the argmax of a full forward, no KV cache, no EOS stop; as llama_ref.py).

The model runs in float32 (weights upcast from f16/bf16) with eager attention, one CPU
thread. The script also compares HF's logits at every prompt position with the
variant's reference.json (llama_ref.py, float64) and prints the largest relative
error ||hf - ref|| / ||ref|| over positions, the metric of tests/worker/reference_test.cc.

Modes:
  record (default): writes the fixtures.
  --check: recomputes and compares with the stored fixtures (hashes, tokens, greedy
      tokens, logits within --tolerance); exits 1 on any difference.

Example:
  tests/make_test_data.sh /tmp/td
  /opt/conveyor-hf-venv/bin/python tests/reference/hf_record.py --data /tmp/td
  /opt/conveyor-hf-venv/bin/python tests/reference/hf_record.py --data /tmp/td --check
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch
import transformers

FIXTURE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_fixtures")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_hashes(model_dir):
    names = ["config.json"] + sorted(n for n in os.listdir(model_dir)
                                     if n.endswith(".safetensors"))
    return {name: sha256(os.path.join(model_dir, name)) for name in names}


def load_model(model_dir):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager",
        output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:  # A name or shape the generator got wrong shows up here.
        raise RuntimeError(f"{model_dir}: weights do not match the model: {problems}")
    return model.eval()


def all_logits(model, tokens):
    with torch.no_grad():
        out = model(torch.tensor([tokens], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float64).numpy()


def greedy(model, prompt, steps):
    seq = list(prompt)
    for _ in range(steps):
        seq.append(int(np.argmax(all_logits(model, seq)[-1])))
    return seq[len(prompt):]


def relative_error(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def floats(values):
    return "[" + ",".join(f"{float(v):.9g}" for v in values) + "]"


def run_variant(model_dir, positions, greedy_tokens):
    """HF's results for one variant, and the max relative error against reference.json."""
    model = load_model(model_dir)
    with open(os.path.join(model_dir, "prompts.json")) as f:
        prompts = json.load(f)
    ref_path = os.path.join(model_dir, "reference.json")
    ref = None
    if os.path.exists(ref_path):
        with open(ref_path) as f:
            ref = json.load(f)["prompts"]
    entries, max_err, greedy_same = [], 0.0, True
    for i, prompt in enumerate(prompts):
        logits = all_logits(model, prompt)
        first = max(0, len(prompt) - positions)
        ids = greedy(model, prompt, greedy_tokens)
        entries.append({"tokens": prompt, "first_position": first,
                        "logits": logits[first:], "greedy": ids})
        if ref is not None:
            ref_logits = np.asarray(ref[i]["logits"], dtype=np.float64)
            for t in range(len(prompt)):
                max_err = max(max_err, relative_error(logits[t], ref_logits[t]))
            greedy_same &= ref[i]["greedy"][:greedy_tokens] == ids
    return entries, (max_err if ref is not None else None), greedy_same


def write_fixture(path, variant, command, hashes, entries, positions):
    head = {
        "variant": variant,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "command": command,
        "dtype": "float32",
        "attn_implementation": "eager",
        "last_positions": positions,
        "sha256": hashes,
    }
    text = json.dumps(head, indent=1)[:-2] + ',\n "prompts":[\n'
    text += ",\n".join(
        '{"tokens":' + json.dumps(e["tokens"]) +
        ',\n"first_position":' + str(e["first_position"]) +
        ',\n"logits":[\n' + ",\n".join(floats(row) for row in e["logits"]) +
        '],\n"greedy":' + json.dumps(e["greedy"]) + "}" for e in entries)
    with open(path, "w") as f:
        f.write(text + "]}\n")


def check_fixture(path, hashes, entries, tolerance):
    """Differences between a stored fixture and this run, as messages."""
    with open(path) as f:
        stored = json.load(f)
    errors = []
    if stored["sha256"] != hashes:
        changed = sorted(set(stored["sha256"].items()) ^ set(hashes.items()))
        errors.append(f"checkpoint files differ from the recorded ones ({changed}); the "
                      "generator's output changed: re-record the fixture")
        return errors
    if len(stored["prompts"]) != len(entries):
        return errors + ["prompt count differs"]
    for i, (s, e) in enumerate(zip(stored["prompts"], entries)):
        if s["tokens"] != e["tokens"] or s["first_position"] != e["first_position"]:
            errors.append(f"prompt {i}: tokens differ")
            continue
        for t, (a, b) in enumerate(zip(e["logits"], np.asarray(s["logits"]))):
            err = relative_error(a, b)
            if err > tolerance:
                errors.append(f"prompt {i} position {s['first_position'] + t}: relative "
                              f"error {err:.3g} > {tolerance:g}")
        if s["greedy"] != e["greedy"]:
            errors.append(f"prompt {i}: greedy tokens differ")
    return errors


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True,
                   help="directory that tests/make_test_data.sh filled (one folder per "
                        "variant)")
    p.add_argument("--variants", nargs="*", help="only these variants (default: all)")
    p.add_argument("--fixtures", default=FIXTURE_DIR, help="fixture directory")
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    p.add_argument("--positions", type=int, default=4,
                   help="logits of this many last positions per prompt (default 4)")
    p.add_argument("--greedy-tokens", type=int, default=32)
    p.add_argument("--tolerance", type=float, default=1e-5,
                   help="--check: largest relative logit error accepted (default 1e-5)")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    variants = args.variants or sorted(
        d for d in os.listdir(args.data)
        if os.path.exists(os.path.join(args.data, d, "config.json")))
    command = ("tests/reference/hf_record.py --data DATA" +
               (f" --positions {args.positions}" if args.positions != 4 else "") +
               (f" --greedy-tokens {args.greedy_tokens}" if args.greedy_tokens != 32 else ""))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    os.makedirs(args.fixtures, exist_ok=True)
    failed = False
    for variant in variants:
        model_dir = os.path.join(args.data, variant)
        hashes = checkpoint_hashes(model_dir)
        entries, max_err, greedy_same = run_variant(model_dir, args.positions,
                                                    args.greedy_tokens)
        versus = ("no reference.json" if max_err is None else
                  f"vs llama_ref.py: max relative logit error {max_err:.3g}, greedy "
                  f"{'identical' if greedy_same else 'DIFFERENT'}")
        path = os.path.join(args.fixtures, variant + ".json")
        if args.check:
            if not os.path.exists(path):
                errors = [f"no fixture {path}"]
            else:
                errors = check_fixture(path, hashes, entries, args.tolerance)
            failed |= bool(errors)
            print(f"{variant}: {'OK' if not errors else 'FAILED'}; {versus}")
            for e in errors:
                print("  " + e)
        else:
            write_fixture(path, variant, command, hashes, entries, args.positions)
            print(f"{variant}: wrote {path} ({os.path.getsize(path)} B); {versus}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
