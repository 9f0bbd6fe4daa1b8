#!/usr/bin/env python3
"""Conveyor replicas behind a router the field already runs (issue J): `vllm-router` (or
`sglang-router`) from PyPI in front of R scheduler + worker pairs on loopback, each with
its OpenAI port. A multi-tenant workload (T system prompts, each request one of them plus
a distinct question) runs once per routing policy on fresh replicas; per run: the
prefix-cache hit rate summed over the replicas' metrics, TTFT p50/p90 (first streamed
chunk through the router), requests per replica. Then, under the first policy, one
replica is killed mid-run and restarted: every request must end (a full answer or an
error status, none hangs), the router must stop sending to the dead replica and send to
it again once it is back.

Exits 1 (each reason on a FAIL line) when a request failed while every replica was up,
a request did not end, the restarted replica was not routed to again, or, when both
ran, cache_aware's hit rate was not above round_robin's: tests/router/router_test.sh
runs it as a test. bench/run_router_bench.sh installs the router into a venv and runs
this."""

import argparse
import contextlib
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def _listen_ports():
    """Ports below the kernel's ephemeral range: no client socket is ever given one as its
    source port, and no free_port() of another test (they pick ephemeral ports) returns
    one, so a replica restarted on the same ports finds them still free."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10000, max(low, 11000))


_picked = set()


def free_port():
    """A port nothing listens on now, outside the ephemeral range, not returned before."""
    ports = _listen_ports()
    for _ in range(1000):
        port = random.randrange(ports.start, ports.stop)
        if port in _picked:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _picked.add(port)
        return port
    raise SystemExit("no free port below the ephemeral range")


def http_get(port, path, timeout=2.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.read().decode()


def metric_sum(port, name):
    """The sum of every sample of `name` on a replica's metrics page (None if down)."""
    try:
        _, page = http_get(port, "/metrics")
    except OSError:
        return None
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


# The name every replica serves; requests name it (sglang-router refuses a completion
# without a model, and fills a chat request's missing one with "unknown").
MODEL = "conveyor-demo"


class Replica:
    """One tensor-parallel group: a worker and the scheduler that drives it."""

    def __init__(self, args, index):
        self.args = args
        self.index = index
        self.worker_port, self.grpc_port = free_port(), free_port()
        self.http_port, self.metrics_port = free_port(), free_port()
        self.procs = []

    def start(self):
        a = self.args
        log = open(os.path.join(a.log_dir, f"replica{self.index}.log"), "ab")
        self.procs = [
            subprocess.Popen([f"{a.build_dir}/worker/conveyor-worker",
                              f"--port={self.worker_port}", "--metrics_port=0",
                              f"--threads={a.threads}"], stdout=log, stderr=log),
            subprocess.Popen([f"{a.build_dir}/scheduler/conveyor-scheduler",
                              f"--model={a.model_dir}", f"--served_model_name={MODEL}",
                              f"--workers=127.0.0.1:{self.worker_port}",
                              f"--port={self.grpc_port}", f"--http_port={self.http_port}",
                              f"--metrics_port={self.metrics_port}",
                              f"--kv_cache_bytes={a.kv_cache_bytes}"], stdout=log, stderr=log)]
        deadline = time.time() + 120
        while time.time() < deadline and all(p.poll() is None for p in self.procs):
            try:
                if http_get(self.http_port, "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"replica {self.index} did not become ready (see {a.log_dir})")

    def kill(self):
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()
        self.procs = []

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []

    @property
    def url(self):
        return f"http://127.0.0.1:{self.http_port}"


def start_router(args, policy, replicas, port):
    log = open(os.path.join(args.log_dir, f"router-{policy}.log"), "ab")
    sglang = os.path.basename(args.router).startswith("sglang")
    # Health checks every second, and a replica's circuit breaker tried again after
    # --breaker-timeout-s (the routers' defaults: 60 s each).
    command = [args.router, *(["launch"] if sglang else []), "--host", "127.0.0.1",
               "--port", str(port), "--policy", policy, "--worker-urls", *[r.url for r in replicas],
               "--health-check-interval-secs", "1",
               "--cb-timeout-duration-secs", str(args.breaker_timeout_s),
               # Its own metrics page on a free port (the default, 29000, may be taken).
               "--prometheus-port", str(free_port()),
               "--log-level", "warn" if sglang else "warning"]
    proc = subprocess.Popen(command, stdout=log, stderr=log)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            complete(port, "hello", 1)
            return proc
        except (OSError, http.client.HTTPException, RuntimeError):
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the router did not start (see {args.log_dir}/router-{policy}.log)")


def complete(port, prompt, max_tokens, timeout=120):
    """Streams a completion through `port`; returns (TTFT seconds, text). Raises on a
    non-200 answer (RuntimeError with the status) or a broken stream."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    start = time.perf_counter()
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}")
    ttft, text, done = None, "", False
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(f"stream error: {event['error'].get('message')}")
        if ttft is None:
            ttft = time.perf_counter() - start
        for choice in event.get("choices", []):
            text += choice.get("text", "")
    connection.close()
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    return ttft, text


def workload(args, seed):
    """(tenant, prompt) pairs: T system prompts of `system_words` words, each request one
    of them and a question of its own; tenants interleaved."""
    rng = random.Random(seed)
    words = ["river", "stone", "light", "green", "table", "music", "cloud", "north", "paper",
             "glass", "field", "horse", "winter", "garden", "silver", "market", "window"]
    systems = [" ".join(rng.choice(words) for _ in range(args.system_words))
               for _ in range(args.tenants)]
    out = []
    for k in range(args.requests):
        tenant = rng.randrange(args.tenants)
        question = " ".join(rng.choice(words) for _ in range(12))
        out.append((tenant, f"{systems[tenant]}\nQuestion {k}: {question}\nAnswer:"))
    return out


def run(args, port, requests, max_tokens=None):
    """Sends `requests` with `args.concurrency` clients; returns one outcome per request:
    ("ok", ttft) or ("error", message)."""
    def one(item):
        try:
            ttft, _ = complete(port, item[1], max_tokens or args.max_tokens)
            return ("ok", ttft)
        except (OSError, http.client.HTTPException, RuntimeError, ValueError) as error:
            return ("error", str(error) or type(error).__name__)

    with ThreadPoolExecutor(args.concurrency) as pool:
        return list(pool.map(one, requests))


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


@contextlib.contextmanager
def cluster(args, policy):
    """Fresh replicas (empty prefix caches) and a router with `policy` in front; yields
    (replicas, the router's port) and stops them all."""
    replicas = [Replica(args, i) for i in range(args.replicas)]
    router = None
    try:
        for r in replicas:
            r.start()
        port = free_port()
        router = start_router(args, policy, replicas, port)
        yield replicas, port
    finally:
        if router is not None:
            router.kill()
            router.wait()
        for r in replicas:
            r.stop()


COUNTERS = ("conveyor_prefix_cache_hits_total", "conveyor_prefix_cache_queries_total",
            "conveyor_requests_finished_total")


def policy_run(args, policy):
    with cluster(args, policy) as (replicas, port):
        before = [[metric_sum(r.metrics_port, name) for name in COUNTERS] for r in replicas]
        outcomes = run(args, port, workload(args, seed=11))
        after = [[metric_sum(r.metrics_port, name) for name in COUNTERS] for r in replicas]
    hits = sum(a[0] - b[0] for a, b in zip(after, before))
    queries = sum(a[1] - b[1] for a, b in zip(after, before))
    per_replica = [int(a[2] - b[2]) for a, b in zip(after, before)]
    ttfts = [t for kind, t in outcomes if kind == "ok"]
    errors = sum(1 for kind, _ in outcomes if kind == "error")
    print(f"| {policy} | {len(outcomes)} | {errors} | {hits / max(queries, 1):.1%} | "
          f"{statistics.median(ttfts) * 1000:.0f} | {percentile(ttfts, 0.9) * 1000:.0f} | "
          f"{' / '.join(map(str, per_replica))} |", flush=True)
    return errors, hits / max(queries, 1)


def failover_run(args, policy):
    """Returns whether every request ended, none failed while every replica was up, and
    the killed replica served again once back."""
    requests = workload(args, seed=23) * 2
    third = len(requests) // 3
    # Once it is back, tenants the router has not seen: a cache-aware router keeps the
    # ones it has seen where their prefixes are, and sends new ones to the least loaded.
    requests[2 * third:] = workload(args, seed=29)[:len(requests) - 2 * third]
    phases = {}
    with cluster(args, policy) as (replicas, port):
        victim = replicas[1]
        phases["before"] = run(args, port, requests[:third])
        served_before = metric_sum(victim.metrics_port, "conveyor_requests_finished_total")
        # Killed while a phase of longer answers runs: requests on it at that moment end
        # with an error status (or the router retries them elsewhere).
        killer = threading.Timer(args.kill_after_s, victim.kill)
        killer.start()
        phases["killed"] = run(args, port, requests[third:2 * third], args.failover_max_tokens)
        killer.join()
        victim.start()  # The same ports: the router's health checks find it again.
        time.sleep(args.rejoin_wait_s)
        phases["back"] = run(args, port, requests[2 * third:])
        served_after = metric_sum(victim.metrics_port, "conveyor_requests_finished_total")
    for name, outcomes in phases.items():
        errors = [m for kind, m in outcomes if kind == "error"]
        print(f"| {name} | {len(outcomes)} | {len(outcomes) - len(errors)} | {len(errors)} | "
              f"{', '.join(sorted(set(errors)))[:80] or '-'} |", flush=True)
    print(f"\nthe killed replica finished {served_before:.0f} requests before it died and "
          f"{served_after:.0f} after it came back (its counters restart at 0)")
    ended = sum(len(o) for o in phases.values())
    print(f"every request ended: {ended} of {len(requests)}")
    up_errors = sum(kind == "error" for name in ("before", "back") for kind, _ in phases[name])
    return ended == len(requests) and up_errors == 0 and (served_after or 0) > 0


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--router", required=True, help="the vllm-router (or sglang-router) binary")
    parser.add_argument("--policies", nargs="+",
                        default=["cache_aware", "round_robin", "power_of_two"])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="worker threads per replica")
    parser.add_argument("--tenants", type=int, default=24)
    parser.add_argument("--system-words", type=int, default=200)
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=8)
    # 64 MiB of the demo model's KV (3 KiB a token) holds ~21 800 tokens: every tenant's
    # prompt (~300 tokens each) and the running requests.
    parser.add_argument("--kv-cache-bytes", type=int, default=64 << 20)
    parser.add_argument("--breaker-timeout-s", type=int, default=3)
    parser.add_argument("--rejoin-wait-s", type=float, default=6.0)
    parser.add_argument("--kill-after-s", type=float, default=0.5)
    parser.add_argument("--failover-max-tokens", type=int, default=120)
    parser.add_argument("--log-dir", default="/tmp/conveyor-router-bench")
    args = parser.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    print(f"{args.replicas} replicas ({args.model_dir}, {args.threads} worker thread(s) each), "
          f"router {os.path.basename(args.router)}; {args.requests} requests from "
          f"{args.concurrency} clients, {args.tenants} tenants' system prompts of "
          f"{args.system_words} words + a question each, {args.max_tokens} tokens out\n")
    print("| policy | requests | errors | prefix-cache hit rate | TTFT p50 ms | TTFT p90 ms | "
          "requests per replica |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    results = {policy: policy_run(args, policy) for policy in args.policies}
    print(f"\nOne replica killed and restarted ({args.policies[0]}):\n")
    print("| phase | requests | ok | errors | error kinds |")
    print("| --- | --- | --- | --- | --- |")
    failures = [] if failover_run(args, args.policies[0]) else [
        "failover: a request did not end, one failed while every replica was up, or the "
        "killed replica served nothing once back"]
    failures += [f"{policy}: {errors} request(s) failed"
                 for policy, (errors, _) in results.items() if errors]
    if "cache_aware" in results and "round_robin" in results:
        cache_aware, round_robin = results["cache_aware"][1], results["round_robin"][1]
        if cache_aware <= round_robin:
            failures.append(f"cache_aware's prefix-cache hit rate ({cache_aware:.1%}) is not "
                            f"above round_robin's ({round_robin:.1%})")
    for failure in failures:
        print(f"FAIL {failure}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
