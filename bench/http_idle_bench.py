#!/usr/bin/env python3
"""The HTTP front under connection load: N idle connections held open while S streams
run, against a real conveyor-scheduler (--http_port) and conveyor-worker on the tiny test
model.

  bench/http_idle_bench.py [--build build] [--idle 10000] [--streams 64] [--mode silent]

Starts both processes, records the scheduler's threads and RSS, opens the idle connections
(`silent`: connected, nothing sent; `slow`: a request line, then one header line a second
- cut off by --http_header_timeout_s, so the run keeps reopening them), then for
--duration seconds S clients stream completions one after another (POST /v1/completions,
stream: true, --max_tokens each) while /health and /metrics are fetched every 50 ms on
fresh connections from threads of their own (blocking sockets: their timing does not wait
for the event loop that holds the idle connections). Prints, and with --out writes as
JSON: streams completed (each must end with "data: [DONE]"), /health and /metrics latency
(connect to last byte), the scheduler's threads and RSS before, with the connections held,
during and after, and RSS per idle connection.

Needs an open-files limit above --idle for this process (`ulimit -n`); the scheduler
raises its own to the hard limit. Python's asyncio holds the connections and runs the
streams in one thread.
"""

import argparse
import asyncio
import json
import os
import resource
import socket
import sys
import threading
import time

from http_bench_server import ROOT, Servers, cpu_name, proc_status


async def stream(port, max_tokens, prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: " + str(len(body)).encode() +
                 b"\r\n\r\n" + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in data


async def hold_idle(port, n, mode, stop):
    """Opens n connections and keeps them open (re-opening any the server closes) until
    `stop` is set. Returns the tasks, the open writers, and a count of connections opened."""
    conns = []
    opened = 0

    async def one():
        nonlocal opened
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.5)
                continue
            opened += 1
            conns.append(writer)
            try:
                if mode == "slow":
                    writer.write(b"GET /health HTTP/1.1\r\n")
                    while not stop.is_set() and not reader.at_eof():
                        await asyncio.sleep(1)
                        writer.write(b"X-Slow: 1\r\n")
                        await writer.drain()
                else:
                    await reader.read(1)  # Quiet until the server closes (or cancelled).
            except (ConnectionError, OSError):
                pass
            conns.remove(writer)
            writer.close()

    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one()))
        if i % 200 == 199:
            await asyncio.sleep(0.01)  # Let the backlog drain.
    return tasks, conns, lambda: opened


def probe(port, path, stop, latencies, statuses):
    """On its own thread with blocking sockets, so that the probe's timing does not wait
    for the event loop that holds the idle connections: connect to last byte."""
    while not stop.is_set():
        start = time.perf_counter()
        data = b""
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                          .encode())
                while chunk := s.recv(65536):
                    data += chunk
        except OSError:
            pass  # Unanswered within 10 s: counted as a status 0.
        latencies.append(time.perf_counter() - start)
        statuses.append(int(data[9:12]) if data.startswith(b"HTTP/") else 0)
        time.sleep(0.05)


async def run(args, http_port, scheduler_pid, result):
    result["before"] = proc_status(scheduler_pid)
    stop = asyncio.Event()
    tasks, conns, opened = await hold_idle(http_port, args.idle, args.mode, stop)
    deadline = time.time() + 120
    while len(conns) < args.idle and time.time() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(1)
    result["idle_open"] = len(conns)
    result["held"] = proc_status(scheduler_pid)
    result["rss_per_idle_connection_bytes"] = round(
        (result["held"]["rss_kib"] - result["before"]["rss_kib"]) * 1024 / max(1, len(conns)))

    health, metrics, statuses, metric_statuses = [], [], [], []
    probing = threading.Event()
    probes = [threading.Thread(target=probe, args=(http_port, "/health", probing, health, statuses)),
              threading.Thread(target=probe, args=(args.metrics_port, "/metrics", probing,
                                                   metrics, metric_statuses))]
    for t in probes:
        t.start()
    # Closed loop: each of the S clients streams one request after another for --duration.
    start = time.perf_counter()
    done = []

    async def client(i):
        while time.perf_counter() - start < args.duration:
            try:
                done.append(await asyncio.wait_for(
                    stream(http_port, args.max_tokens, [3 + i % 50, 7, 11]), args.stream_timeout))
            except (asyncio.TimeoutError, OSError):
                done.append(False)  # Unanswered (or refused) within the timeout.

    await asyncio.gather(*[client(i) for i in range(args.streams)])
    result["streams_seconds"] = round(time.perf_counter() - start, 2)
    probing.set()
    for t in probes:
        t.join()
    result["during"] = proc_status(scheduler_pid)
    result["idle_open_after_streams"] = len(conns)
    result["idle_opened_in_all"] = opened()
    result["streams_completed"] = sum(done)
    result["streams_started"] = len(done)
    result["concurrent_streams"] = args.streams

    def summary(values):
        values = sorted(values)
        if not values:
            return {}
        return {"n": len(values), "p50_ms": round(1000 * values[len(values) // 2], 2),
                "p99_ms": round(1000 * values[min(len(values) - 1, int(len(values) * 0.99))], 2),
                "max_ms": round(1000 * values[-1], 2)}

    result["health"] = summary(health)
    result["health_non_200"] = sum(1 for s in statuses if s != 200)
    result["metrics_non_200"] = sum(1 for s in metric_statuses if s != 200)
    result["metrics"] = summary(metrics)
    stop.set()
    for writer in list(conns):
        writer.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(1)
    result["after"] = proc_status(scheduler_pid)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--idle", type=int, default=10000)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--max_tokens", type=int, default=256)
    parser.add_argument("--stream_timeout", type=float, default=30,
                        help="a stream not done in this many seconds counts as failed")
    parser.add_argument("--duration", type=float, default=10,
                        help="seconds the streams run (each client streams one request "
                             "after another)")
    parser.add_argument("--mode", choices=["silent", "slow"], default="silent")
    parser.add_argument("--scheduler_flags", default="",
                        help="extra conveyor-scheduler flags, space-separated")
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.idle + 500:
        sys.exit(f"the open-files limit ({hard}) is too low for {args.idle} connections")

    with Servers(args.build, args.scheduler_flags.split(), max(64, args.streams)) as servers:
        args.metrics_port = servers.metrics_port
        result = {"idle": args.idle, "mode": args.mode, "cpu": cpu_name()}
        asyncio.run(run(args, servers.http_port, servers.scheduler_pid, result))
        result["scheduler_alive"] = servers.alive()
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    ok = (result["streams_completed"] == result["streams_started"] and result["scheduler_alive"]
          and result["health_non_200"] == 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
