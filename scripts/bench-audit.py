#!/usr/bin/env python3
"""What the audit log costs POST /v1/run: two `codecage serve` of the same binary, one
with the audit log (the defaults: code and output kept) and one without, each on a unix
socket of its own, and a client that sends them the same request in pairs (which goes
first alternates), on one keep-alive connection each. Prints the medians side by side and
the median of the per-pair ratios.

    sudo scripts/bench-audit.py target/release/codecage [PAIRS] [REQUEST-JSON]

Run as root (the servers build sandboxes). Everything lives in a temp dir, removed after.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("codecage")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def start(binary, work, name, audit):
    config = os.path.join(work, f"{name}.toml")
    with open(config, "w") as f:
        # No warm pool: its refills would run beside the measured requests.
        f.write("[limits]\nqueue_timeout = \"60s\"\n[pool]\nruns = {}\nsessions = {}\n[audit]\n")
        if audit:
            f.write(f"path = {json.dumps(os.path.join(work, name, 'audit.db'))}\n")
        else:
            f.write("enabled = false\n")
    sock = os.path.join(work, f"{name}.sock")
    proc = subprocess.Popen(
        [binary, "serve", "--config", config, "--listen", f"unix:{sock}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    end = time.time() + 10
    while not os.path.exists(sock):
        if time.time() > end:
            raise SystemExit(f"the {name} server did not come up")
        time.sleep(0.05)
    return proc, UnixConnection(sock)


def post(conn, body):
    start = time.perf_counter()
    conn.request("POST", "/v1/run", body=body, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    data = answer.read()
    took = time.perf_counter() - start
    if answer.status != 200:
        raise SystemExit(f"HTTP {answer.status}: {data[:200]!r}")
    return took


def main():
    binary = os.path.abspath(sys.argv[1])
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    body = sys.argv[3] if len(sys.argv) > 3 else json.dumps({"language": "bash", "code": "echo hello"})
    work = tempfile.mkdtemp(prefix="codecage-bench-audit-")
    servers = []
    try:
        on = start(binary, work, "audited", True)
        off = start(binary, work, "plain", False)
        servers = [on[0], off[0]]
        for _ in range(20):  # warm-up, not counted
            post(on[1], body)
            post(off[1], body)
        with_audit, without, ratios = [], [], []
        for i in range(pairs):
            if i % 2 == 0:
                a = post(on[1], body)
                b = post(off[1], body)
            else:
                b = post(off[1], body)
                a = post(on[1], body)
            with_audit.append(a)
            without.append(b)
            ratios.append(a / b)
        ms = lambda xs: statistics.median(xs) * 1000
        p90 = lambda xs: sorted(xs)[int(len(xs) * 0.9)] * 1000
        print(f"POST /v1/run {body}, {pairs} pairs")
        print("| | median | p90 |")
        print("|---|---|---|")
        print(f"| audit off | {ms(without):.2f} ms | {p90(without):.2f} ms |")
        print(f"| audit on (code and output kept) | {ms(with_audit):.2f} ms | {p90(with_audit):.2f} ms |")
        print(f"| on / off, median of the pairs' ratios | {statistics.median(ratios):.3f} | |")
        print(f"| on - off, medians | {ms(with_audit) - ms(without):+.2f} ms | |")
    finally:
        for proc in servers:
            proc.send_signal(signal.SIGTERM)
        for proc in servers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
