#!/usr/bin/env python3
"""Peak scheduler memory per HTTP request body, by body shape: what one request can make
the process hold (docs/http-api.md, "Limits").

  bench/http_body_memory_bench.py [--build build] [--concurrent 4] [--out result.json]

Starts a worker and a scheduler (--http_port) on the tiny test model. For each shape, resets
the scheduler's peak RSS (/proc/PID/clear_refs) in a fresh process, sends the body (a POST to
/v1/completions) `--concurrent` times at once, and reports the answers' statuses and the
peak RSS above the RSS before. The shapes are the costliest per byte for each stage: a
body at the 16 MiB limit that is refused by the JSON bounds before any tree is built
(100 000-deep nesting; 8 Mi values), and bodies just under the bounds whose tree is built
(1 Mi tiny values of each kind: numbers, empty arrays, empty objects, one-key objects).
"""

import argparse
import asyncio
import json
import sys
import time

from http_bench_server import ROOT, Servers, cpu_name, proc_status, reset_peak_rss

MIB = 1 << 20


def shapes():
    # Each wraps its filler in a field the request path ignores, so the body is parsed and
    # walked as far as the API does, then refused cheaply (the prompt is "a").
    def ignored(filler):
        return '{"prompt": "a", "max_tokens": 1, "ignored": ' + filler + "}"

    n = (1 << 20) - 16  # Just under the 1 Mi value bound.
    return {
        "deep_100k_refused": ignored("[" * 100000 + "]" * 100000),
        "16MiB_flat_refused": ignored("[" + ",".join(["0"] * (8 * MIB - 64)) + "]"),
        "1Mi_numbers": ignored("[" + ",".join(["0"] * n) + "]"),
        "1Mi_empty_arrays": ignored("[" + ",".join(["[]"] * (n // 2)) + "]"),
        "1Mi_empty_objects": ignored("[" + ",".join(["{}"] * (n // 2)) + "]"),
        "0.5Mi_one_key_objects": ignored("[" + ",".join(['{"k":0}'] * (n // 2)) + "]"),
        "16MiB_string": ignored('"' + "x" * (16 * MIB - 100) + '"'),
    }


async def post(port, body):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = body.encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\nContent-Length: " + str(len(data)).encode()
                 + b"\r\n\r\n" + data)
    try:
        await writer.drain()
    except ConnectionError:
        pass  # Refused before the whole body was read: the answer is still there.
    answer = await reader.read()
    writer.close()
    return int(answer[9:12]) if answer.startswith(b"HTTP/") else 0


async def measure(port, pid, body, concurrent):
    await asyncio.sleep(0.5)
    before = proc_status(pid)["rss_kib"]
    reset_peak_rss(pid)
    start = time.perf_counter()
    statuses = await asyncio.gather(*[post(port, body) for _ in range(concurrent)])
    seconds = time.perf_counter() - start
    await asyncio.sleep(0.5)
    after = proc_status(pid)
    return {"body_mib": round(len(body) / MIB, 2), "statuses": sorted(set(statuses)),
            "seconds": round(seconds, 2),
            "peak_above_before_mib": round((after["hwm_kib"] - before) / 1024, 1),
            "peak_per_request_mib": round((after["hwm_kib"] - before) / 1024 / concurrent, 1),
            "rss_after_minus_before_mib": round((after["rss_kib"] - before) / 1024, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=f"{ROOT}/build")
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    result = {"cpu": cpu_name(), "concurrent": args.concurrent, "shapes": {}}
    alive = True
    for name, body in shapes().items():
        # A fresh process per shape: memory another shape freed would hide this one's peak.
        with Servers(args.build) as servers:
            result["shapes"][name] = asyncio.run(
                measure(servers.http_port, servers.scheduler_pid, body, args.concurrent))
            alive = alive and servers.alive()
        print(name, result["shapes"][name], flush=True)
    result["scheduler_alive"] = alive
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    sys.exit(0 if result["scheduler_alive"] else 1)


if __name__ == "__main__":
    main()
