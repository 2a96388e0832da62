"""Issue 43's probes of `torchggml serve`, bounded and repeatable, against a loopback server it starts.

    PYTHONPATH=$PWD python scripts/abuse_server.py                 # abuse: hostile requests in flight
    PYTHONPATH=$PWD python scripts/abuse_server.py --mode mixed    # 500 ordinary requests, RSS growth
    PYTHONPATH=$PWD python scripts/abuse_server.py --model M.gguf --parallel 4
    PYTHONPATH=$PWD python scripts/abuse_server.py --mode mixed --parallel 8 --clients 16 -- -c 1024
    PYTHONPATH=$PWD python scripts/abuse_server.py --mode schema --model SmolLM2-135M-Instruct.Q4_1.gguf

abuse: while the probes run (a 10 MB prompt, a 7 MB prompt, 4,000 prompts x n=16 = 64,000 sequences,
2,000,000 one-token prompts, 25 slow-header clients, 1,000 stop strings of 3,000 characters, a flood
of keyless requests to random paths, a /metrics label injection, bad seeds, grammars and Unicode),
/health is polled every 50 ms and an ordinary completion is sent again and again (each from a
process of its own, so that the probes' work does not delay them); the table gives
each probe's answers and time, /health's latency (p50, p99, max) and the ordinary request's,
beside the same request's latency before the abuse.

schema: a JSON schema of numbers at temperature 0 (greedy: one request) and 0.8 (--seeds seeds): does each answer parse,
and its longest digit run (llama.cpp's bound: 16).

mixed: 500 requests (chat, completions, embeddings, streaming, JSON schema, grammar) from
--clients threads after a warm-up of 50; failures counted (a schema answer must parse, a stream
must end with [DONE]), the server's RSS before and after.

Nothing here asserts: it prints what it measured (loopback only, the server is a child process).
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "abuse-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: str | None, parallel: int, extra: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        args = [sys.executable, "-m", "torchggml", "serve", *([model] if model else []), "--port", str(self.port),
                "--parallel", str(parallel), "--api-key", KEY, *extra]
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 600
        while request(self.url + "/health", timeout=5)[0] != 200:
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.5)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def request(url: str, body=None, key: str | None = KEY, timeout: float = 300) -> tuple[int, bytes, float]:
    """(status (0: no answer), body, seconds) of one request."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as r:
            return r.status, r.read(), time.perf_counter() - t
    except urllib.error.HTTPError as e:
        return e.code, e.read(), time.perf_counter() - t
    except (OSError, http.client.HTTPException):
        return 0, b"", time.perf_counter() - t


def raw_post(url: str, path: str, body: bytes, timeout: float = 300) -> tuple[int, bytes, float]:
    """A POST whose answer is read even when the server answers (413) before taking the whole body
    and closes: urllib would report only the broken pipe."""
    host, port = url.rsplit("/", 1)[1].split(":")
    t = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: "
                     f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        try:
            for i in range(0, len(body), 1 << 16):
                sock.sendall(body[i:i + (1 << 16)])
        except OSError:
            pass  # answered early: read the answer below
        response = http.client.HTTPResponse(sock)
        try:
            response.begin()
            return response.status, response.read(), time.perf_counter() - t
        except (OSError, http.client.HTTPException):
            return 0, b"", time.perf_counter() - t


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# ---------------------------------------------------------------- abuse

def slow_header_clients(url: str, n: int, seconds: float) -> str:
    """n connections sending a request's headers a byte every 0.2 s; how many the server closed
    within `seconds`, and when."""
    port = int(url.rsplit(":", 1)[1])
    closed_at = []

    def one():
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(0.2)
            start = time.perf_counter()
            header = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
            for byte in header:
                if time.perf_counter() - start > seconds:
                    return
                try:
                    sock.sendall(bytes([byte]))
                    if sock.recv(1) == b"":
                        closed_at.append(time.perf_counter() - start)
                        return
                except socket.timeout:
                    continue
                except OSError:
                    closed_at.append(time.perf_counter() - start)
                    return
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    when = f", after {min(closed_at):.1f}-{max(closed_at):.1f} s" if closed_at else ""
    return f"{len(closed_at)}/{n} closed by the server{when}"


def flood_paths(url: str, n: int) -> str:
    statuses = {}

    def one(i):
        return request(f"{url}/random/{random.getrandbits(64):x}/{i}", key=None, timeout=30)[0]
    with ThreadPoolExecutor(8) as pool:
        for s in pool.map(one, range(n)):
            statuses[s] = statuses.get(s, 0) + 1
    code, text, dt = request(url + "/metrics")
    return f"{statuses}; /metrics {len(text)} bytes, {dt * 1000:.0f} ms"


def _measure(url, body, key, pause, stop, out, name) -> None:
    """In a process of its own: the latency of `url` again and again until `stop` (inf: failed)."""
    times = []
    while not stop.is_set():
        code, _, dt = request(url, body, key=key, timeout=60)
        times.append(dt if code == 200 else float("inf"))
        time.sleep(pause)
    out.put((name, times))


def abuse(server: Server, args) -> None:
    url = server.url
    ordinary = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    before = [request(url + "/v1/completions", ordinary)[2] for _ in range(10)]
    # the probes' own work (building and sending megabytes) must not delay the measuring clients:
    # those run in processes of their own
    ctx = multiprocessing.get_context("fork")
    stop, results_queue = ctx.Event(), ctx.Queue()
    measurers = [ctx.Process(target=_measure, args=(url + "/health", None, None, 0.05, stop, results_queue, "health")),
                 ctx.Process(target=_measure, args=(url + "/v1/completions", ordinary, KEY, 0, stop, results_queue,
                                                    "ordinary"))]

    def answer(path, body):
        if body is None:
            code, text, dt = request(url + path, body)
        else:
            code, text, dt = raw_post(url, path, body if isinstance(body, bytes) else json.dumps(body).encode())
        try:
            message = json.loads(text)["error"]["message"][:70] if code != 200 else "ok"
        except (ValueError, KeyError, TypeError):
            message = text[:70].decode(errors="replace")
        return f"{code} in {dt:.2f} s: {message}"

    completions, chat = "/v1/completions", "/v1/chat/completions"
    probes = {
        "10 MB prompt": lambda: answer(completions, {"prompt": "a " * 5_000_000}),
        "7 MB prompt": lambda: answer(completions, {"prompt": "a " * 3_500_000}),
        "7 MB chat message": lambda: answer(chat, {"messages": [{"role": "user", "content": "a " * 3_500_000}]}),
        "7 MB embeddings input": lambda: answer("/v1/embeddings", {"input": "a " * 3_500_000}),
        "4,000 prompts x n=16": lambda: answer(completions, {"prompt": ["hi"] * 4000, "n": 16}),
        "2,000,000 one-token prompts": lambda: answer(completions, b'{"prompt": [' + b"[1]," * 1_999_999 + b"[1]]}"),
        "16,000 one-token prompts": lambda: answer(completions, {"prompt": [[1]] * 16_000}),
        "1,000 stop strings x 3,000 chars": lambda: answer(completions, {"prompt": "x", "stop": ["s" * 3000] * 1000}),
        f"{args.slow_clients} slow-header clients": lambda: slow_header_clients(url, args.slow_clients, 30),
        f"{args.flood:,} keyless random paths": lambda: flood_paths(url, args.flood),
        "metrics injection path": lambda: answer("/x%22%7D%201%0Atorchggml_injected_total%201", None),
        "seed 2^64": lambda: answer(completions, {"prompt": "x", "max_tokens": 2, "seed": 2**64}),
        "seed -2^63-1": lambda: answer(completions, {"prompt": "x", "max_tokens": 2, "seed": -(2**63) - 1}),
        "seed 10^40": lambda: answer(completions, {"prompt": "x", "max_tokens": 2, "seed": 10**40}),
        "grammar: empty language": lambda: answer(completions, {"prompt": "x", "grammar": 'root ::= x\nx ::= x "a"'}),
        "grammar: 60 KB literal, unterminated": lambda: answer(completions, {"prompt": "x",
                                                                             "grammar": 'root ::= "' + "a" * 60_000}),
        "grammar: 10 MB literal": lambda: answer(completions, {"prompt": "x",
                                                               "grammar": 'root ::= "' + "a" * 10_000_000 + '"'}),
        "lone surrogate in a prompt": lambda: answer(completions, b'{"prompt": "a\\ud800b"}'),
    }
    quiet = []
    for _ in range(100):  # /health on this machine with no abuse, for comparison
        code, _, dt = request(url + "/health", key=None, timeout=60)
        quiet.append(dt if code == 200 else float("inf"))
        time.sleep(0.05)
    for m in measurers:
        m.start()
    results = {}
    start = time.perf_counter()
    with ThreadPoolExecutor(len(probes)) as pool:  # every probe in flight at once
        futures = {name: pool.submit(fn) for name, fn in probes.items()}
        for name, f in futures.items():
            results[name] = f.result()
    elapsed = time.perf_counter() - start
    stop.set()
    measured = dict(results_queue.get() for _ in measurers)
    for m in measurers:
        m.join()
    health, during = measured["health"], measured["ordinary"]
    code, text, _ = request(url + "/metrics")
    injected = b"injected" in text
    width = max(map(len, results))
    print(f"\n{'probe':<{width}}  answer")
    for name, result in results.items():
        print(f"{name:<{width}}  {result}")
    ms = lambda v: "fail" if v == float("inf") else f"{v * 1000:.0f} ms"  # noqa: E731
    print(f"\nabuse in flight for {elapsed:.1f} s; metrics injection present: {injected}; server alive: "
          f"{server.proc.poll() is None}")
    print(f"/health with no abuse: {len(quiet)} polls, p50 {ms(pct(quiet, 0.5))}, p99 {ms(pct(quiet, 0.99))}, "
          f"max {ms(max(quiet))}")
    print(f"/health while abused: {len(health)} polls, p50 {ms(pct(health, 0.5))}, p99 {ms(pct(health, 0.99))}, "
          f"max {ms(max(health))}, failures {sum(v == float('inf') for v in health)}")
    print(f"ordinary completion (8 tokens): before p50 {ms(pct(before, 0.5))} max {ms(max(before))}; while abused "
          f"{len(during)} requests, p50 {ms(pct(during, 0.5))}, max {ms(max(during)) if during else '-'}")


# ---------------------------------------------------------------- mixed

def mixed(server: Server, args) -> None:
    url = server.url
    schema = {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                                         "score": {"type": "number"}},
        "required": ["name", "age", "score"], "additionalProperties": False}}}
    kinds = {
        "completion": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16}),
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 16}),
        "embeddings": ("/v1/embeddings", {"input": ["a sentence", "another one"]}),
        "stream": ("/v1/completions", {"prompt": "The graph", "max_tokens": 16, "stream": True}),
        "schema": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "A person"}], "max_tokens": 100,
                                            "response_format": schema}),
        "grammar": ("/v1/completions", {"prompt": "Answer:", "max_tokens": 8, "grammar": 'root ::= "yes" | "no"'}),
    }
    names = list(kinds)
    rng = random.Random(43)
    failures: dict[str, int] = {}

    def one(i):
        name = names[i % len(names)] if i < 0 else rng.choice(names)
        path, body = kinds[name]
        body = dict(body, seed=rng.randrange(2**32), temperature=0.8)
        code, text, dt = request(url + path, body)
        ok = code == 200
        if ok and name == "schema":
            try:
                json.loads(json.loads(text)["choices"][0]["message"]["content"])
            except (ValueError, KeyError):
                ok = False
        if ok and name == "stream":
            ok = text.rstrip().endswith(b"data: [DONE]")
        return name, ok, dt
    with ThreadPoolExecutor(args.clients) as pool:  # warm-up: every kind, caches filled
        list(pool.map(one, range(-50, 0)))
    rss0 = server.rss_mb()
    start = time.perf_counter()
    times: dict[str, list[float]] = {n: [] for n in names}
    with ThreadPoolExecutor(args.clients) as pool:
        for i, (name, ok, dt) in enumerate(pool.map(one, range(args.requests)), 1):
            times[name].append(dt)
            if not ok:
                failures[name] = failures.get(name, 0) + 1
            if i % 50 == 0:
                print(f"{i} requests, {sum(failures.values())} failures, {time.perf_counter() - start:.0f} s, "
                      f"RSS {server.rss_mb():.0f} MB", flush=True)
    elapsed = time.perf_counter() - start
    rss1 = server.rss_mb()
    print(f"\n{'kind':<12} {'n':>5} {'p50 ms':>8} {'max ms':>8} failures")
    for name in names:
        t = times[name]
        print(f"{name:<12} {len(t):>5} {pct(t, 0.5) * 1000:>8.0f} {max(t, default=0) * 1000:>8.0f} "
              f"{failures.get(name, 0)}")
    print(f"\n{args.requests} requests in {elapsed:.1f} s, {sum(failures.values())} failures; server RSS "
          f"{rss0:.0f} -> {rss1:.0f} MB ({(rss1 - rss0) / rss0 * 100:+.2f}%)")


# ---------------------------------------------------------------- schema

def schema(server: Server, args) -> None:
    """JSON-schema output with numbers: parseable at temperature 0 and at 0.8 with --seeds seeds."""
    import re
    fmt = {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"price": {"type": "number"}, "count": {"type": "integer"},
                                         "ratio": {"type": "number"}},
        "required": ["price", "count", "ratio"], "additionalProperties": False}}}
    print(f"\n{'temperature':>11} {'seed':>4} {'parsed':>6} {'tokens':>6} {'longest digit run':>17}  text")
    for temperature in (0.0, 0.8):
        for seed in range(1 if temperature == 0 else args.seeds):  # greedy: every seed draws the same
            body = {"messages": [{"role": "user", "content": "Give a price, a count and a ratio as JSON."}],
                    "max_tokens": 200, "temperature": temperature, "seed": seed, "response_format": fmt}
            code, text, _ = request(server.url + "/v1/chat/completions", body)
            answer = json.loads(text) if code == 200 else {}
            content = answer["choices"][0]["message"]["content"] if answer else text.decode()[:80]
            try:
                json.loads(content)
                parsed = True
            except ValueError:
                parsed = False
            run = max((len(r) for r in re.findall(r"[0-9]+", content)), default=0)
            tokens = answer.get("usage", {}).get("completion_tokens", "-") if answer else "-"
            print(f"{temperature:>11} {seed:>4} {str(parsed):>6} {tokens:>6} {run:>17}  {content[:70]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("abuse", "mixed", "schema"), default="abuse")
    p.add_argument("--model", default=None, help="GGUF file (default: the built-in demo model)")
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--slow-clients", type=int, default=25)
    p.add_argument("--flood", type=int, default=2000, help="keyless requests to random paths")
    p.add_argument("--requests", type=int, default=500, help="mixed: requests after the warm-up")
    p.add_argument("--clients", type=int, default=8, help="mixed: concurrent clients")
    p.add_argument("--seeds", type=int, default=10, help="schema: seeds at temperature 0.8")
    p.add_argument("server_args", nargs="*", help="more `serve` options, after --")
    args = p.parse_args()
    server = Server(args.model, args.parallel, args.server_args)
    try:
        {"abuse": abuse, "mixed": mixed, "schema": schema}[args.mode](server, args)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
