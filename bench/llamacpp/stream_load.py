#!/usr/bin/env python3
"""Streams OpenAI /v1/completions requests at a fixed concurrency against one server
(llama-server or conveyor-scheduler's HTTP API) and prints one JSON line of results.

Every request has its own prompt of --prompt-tokens random token ids (seeded by its
index, so every engine gets the same prompts and no two share a prefix that a prompt
cache could reuse), asks for exactly --max-tokens tokens (ignore_eos, temperature 0) and
streams them. --concurrency clients each send --rounds requests back to back (a closed
loop); the wave's output tok/s is every request's output tokens over the wall time from
the first request sent to the last one finished. Per request: TTFT is the time to the
first streamed chunk, TPOT the time from it to the last chunk over (output tokens - 1).
Output tokens are the server's usage.completion_tokens (stream_options.include_usage);
a request that reports another count than --max-tokens is an error.

  stream_load.py --base-url http://127.0.0.1:8080 --concurrency 8 [--rounds 2]
      [--prompt-tokens 128] [--max-tokens 128] [--vocab 4096] [--warmup]

Standard library only.
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def prompt_ids(index, length, vocab, low):
    """The prompt of request `index`: token ids in [low, vocab), the same for every run."""
    rng = random.Random(1_000_003 * (index + 1))
    return [rng.randrange(low, vocab) for _ in range(length)]


def stream_one(base_url, model, prompt, max_tokens, timeout_s):
    """Sends one streamed completion; returns (ttft_s, tpot_s, output_tokens, total_s)."""
    url = urllib.parse.urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout_s)
    body = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    first = last = None
    chunks = 0
    usage = None
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        event = json.loads(data)
        if event.get("usage"):
            usage = event["usage"]
        if event.get("choices"):
            now = time.perf_counter()
            if first is None:
                first = now
            last = now
            chunks += 1
    conn.close()
    end = time.perf_counter()
    if first is None:
        raise RuntimeError("no streamed chunk")
    tokens = usage["completion_tokens"] if usage else chunks
    if tokens != max_tokens:
        raise RuntimeError(f"{tokens} output tokens, asked for {max_tokens} (usage {usage})")
    tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return first - start, tpot, tokens, end - start


def served_model(base_url, timeout_s):
    """The id of the first model GET /v1/models lists."""
    url = urllib.parse.urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout_s)
    conn.request("GET", "/v1/models")
    models = json.loads(conn.getresponse().read())
    conn.close()
    return models["data"][0]["id"]


def percentile(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def run_wave(args):
    results, errors = [], []
    lock = threading.Lock()
    next_index = [0]
    total = args.concurrency * args.rounds

    def client():
        while True:
            with lock:
                index = next_index[0]
                next_index[0] += 1
            if index >= total:
                return
            prompt = prompt_ids(index + args.seed_offset, args.prompt_tokens, args.vocab,
                                args.lowest_id)
            try:
                r = stream_one(args.base_url, args.model, prompt, args.max_tokens, args.timeout)
            except Exception as e:  # noqa: BLE001 (reported, and the run fails)
                with lock:
                    errors.append(repr(e))
                return
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return results, errors, wall


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2, help="requests per client")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--lowest-id", type=int, default=259,
                   help="smallest prompt token id (259: after <unk> <s> </s> and the bytes)")
    p.add_argument("--seed-offset", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--warmup", action="store_true",
                   help="one request of 8 tokens (not reported), then exit")
    args = p.parse_args()
    if not args.model:
        args.model = served_model(args.base_url, args.timeout)
    if args.warmup:
        stream_one(args.base_url, args.model,
                   prompt_ids(10_000, args.prompt_tokens, args.vocab, args.lowest_id), 8,
                   args.timeout)
        return
    results, errors, wall = run_wave(args)
    if errors:
        print(json.dumps({"errors": errors[:5], "failed": len(errors)}))
        sys.exit(1)
    ttft = [r[0] for r in results]
    tpot = [r[1] for r in results]
    tokens = sum(r[2] for r in results)
    print(json.dumps({
        "concurrency": args.concurrency, "requests": len(results), "output_tokens": tokens,
        "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 2),
        "ttft_p50_ms": round(statistics.median(ttft) * 1e3, 1),
        "ttft_p90_ms": round(percentile(ttft, 0.9) * 1e3, 1),
        "tpot_p50_ms": round(statistics.median(tpot) * 1e3, 2),
        "tpot_p90_ms": round(percentile(tpot, 0.9) * 1e3, 2),
    }))


if __name__ == "__main__":
    main()
