"""What the HTTP front's benchmarks (http_idle_bench.py, http_body_memory_bench.py) share:
a conveyor-worker and a conveyor-scheduler with --http_port on the tiny test model, as a
context manager, and the scheduler process's threads and memory from /proc."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def proc_status(pid):
    """Threads, VmRSS and VmHWM (peak RSS) of process `pid`, in KiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return {"threads": int(fields["Threads"]), "rss_kib": int(fields["VmRSS"].split()[0]),
            "hwm_kib": int(fields["VmHWM"].split()[0])}


def reset_peak_rss(pid):
    """Sets VmHWM back to the current RSS (Linux: clear_refs 5)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _wait_listening(path, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:
                for line in f:
                    if "listening on" in line:
                        return int(line.strip().rsplit(":", 1)[1])
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    sys.exit(f"no 'listening on' line in {path}")


async def http_get(port, path):
    """Seconds from connect to the answer's last byte, and its status."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    status = int(data[9:12]) if data.startswith(b"HTTP/") else 0
    return time.perf_counter() - start, status


class Servers:
    """A worker and a scheduler serving the tiny test model; `http_port`, `metrics_port`,
    `scheduler_pid` once entered. Stops both on exit."""

    def __init__(self, build, scheduler_flags=(), max_num_seqs=64):
        self.build = build
        self.flags = list(scheduler_flags)
        self.max_num_seqs = max_num_seqs
        self.procs = []

    def __enter__(self):
        model = os.path.join(self.build, "tests", "testdata", "llama3_gqa")
        if not os.path.isdir(model):
            subprocess.run([os.path.join(ROOT, "tests", "make_test_data.sh"),
                            os.path.join(self.build, "tests", "testdata")], check=True,
                           stdout=subprocess.DEVNULL)
        tmp = tempfile.mkdtemp()
        self.log_dir = tmp
        worker = subprocess.Popen(
            [os.path.join(self.build, "worker", "conveyor-worker"), "--port=0",
             "--metrics_port=0", "--threads=1"],
            stdout=open(os.path.join(tmp, "worker.out"), "w"),
            stderr=open(os.path.join(tmp, "worker.log"), "w"))
        self.procs.append(worker)
        worker_port = _wait_listening(os.path.join(tmp, "worker.out"))
        self.http_port, self.metrics_port = free_port(), free_port()
        scheduler = subprocess.Popen(
            [os.path.join(self.build, "scheduler", "conveyor-scheduler"), f"--model={model}",
             f"--workers=127.0.0.1:{worker_port}", "--port=0",
             f"--metrics_port={self.metrics_port}", f"--http_port={self.http_port}",
             f"--max_num_seqs={self.max_num_seqs}", "--log_level=warn"] + self.flags,
            stdout=open(os.path.join(tmp, "scheduler.out"), "w"),
            stderr=open(os.path.join(tmp, "scheduler.log"), "w"))
        self.procs.append(scheduler)
        self.scheduler = scheduler
        self.scheduler_pid = scheduler.pid
        _wait_listening(os.path.join(tmp, "scheduler.out"))
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if asyncio.run(http_get(self.http_port, "/health"))[1] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        sys.exit("the scheduler never became ready")

    def alive(self):
        return self.scheduler.poll() is None

    def __exit__(self, *exc):
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
