#!/usr/bin/env python3
"""One request with n choices against n separate requests of the same prompt, over the
OpenAI-compatible HTTP API of a running server (bench/run_choices_bench.sh starts one):
the peak of conveyor_kv_blocks_used while each runs, its wall time and output tok/s."""

import argparse
import json
import random
import threading
import time
import urllib.error
import urllib.request


def post(base, body):
    request = urllib.request.Request(f"http://{base}/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise SystemExit(f"HTTP {error.code}: {error.read().decode()}") from None


def kv_blocks_used(metrics):
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("conveyor_kv_blocks_used"):
                return float(line.split()[-1])
    return 0.0


def wait_ready(base):
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://{base}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("the server did not become ready")


def measure(metrics, run):
    """Runs `run` while polling the KV gauge; returns (peak blocks, seconds, tokens)."""
    peak, done = [0.0], threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], kv_blocks_used(metrics))
            time.sleep(0.005)

    poller = threading.Thread(target=poll)
    poller.start()
    start = time.perf_counter()
    tokens = run()
    seconds = time.perf_counter() - start
    done.set()
    poller.join()
    return peak[0], seconds, tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", required=True)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--n", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    wait_ready(args.http)
    rng = random.Random(7)
    print(f"prompt {args.prompt_tokens} token ids, {args.max_tokens} tokens per choice "
          "(sampled, ignore_eos)")
    print("| round | n | how | peak KV blocks used | seconds | output tok/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for round_ in range(1, args.rounds + 1):
        for n in args.n:
            # A new prompt per run: nothing of it is in the prefix cache.
            prompt = [rng.randrange(3, 4000) for _ in range(args.prompt_tokens)]
            body = dict(prompt=prompt, max_tokens=args.max_tokens, temperature=1.0, seed=1,
                        ignore_eos=True)

            def choices():
                answer = post(args.http, dict(body, n=n))
                return answer["usage"]["completion_tokens"]

            def separate():
                results = [0] * n

                def one(i):
                    results[i] = post(args.http, dict(body, seed=1 + i))["usage"][
                        "completion_tokens"]

                threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                return sum(results)

            for how, run in (("n choices", choices), ("separate", separate)):
                if how == "separate":
                    body["prompt"] = [rng.randrange(3, 4000) for _ in range(args.prompt_tokens)]
                peak, seconds, tokens = measure(args.metrics, run)
                print(f"| {round_} | {n} | {how} | {peak:.0f} | {seconds:.2f} | "
                      f"{tokens / seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
