"""Load and fault probe of both servers on 127.0.0.1 (issue 40): ``drmas serve`` (a tiny model) and ``drmas
retrieval-server`` (BM25 over the synthetic encyclopedia), each in its own process. For each: the latency of a normal
request, concurrent clients, oversized and invalid requests, abandoned requests (clients that time out or drop a
stream), then a normal request again (answered within its usual latency?), and SIGTERM with requests in flight (how
long until the process is gone). Prints one JSON object; counts and every client timeout are bounded.

    python benchmarks/serving/faults.py > benchmarks/serving/results/faults.json
    # the same probe against another checkout's servers (e.g. before the fixes; --skip-oversized: an unchecked
    # 100k-token prompt can take minutes of CPU there)
    python benchmarks/serving/faults.py --server-pythonpath /path/to/other/checkout --skip-oversized

The regression tests of each fault are tests/drmas_train/serving/test_server_faults.py and
tests/drmas_envs/search/test_server_faults.py; this script measures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Server:
    """A ``drmas`` server subprocess; ``url`` once ``ready`` answers."""

    def __init__(self, args: list[str], pythonpath: str | None) -> None:
        self.port = _free_port()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        # run from that checkout too: ``python -m`` puts the working directory first on sys.path
        self.proc = subprocess.Popen([sys.executable, "-m", "drmas_train.cli", *args, "--port", str(self.port)],
                                     env=env, cwd=pythonpath, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, probe: Any, limit_s: float = 300) -> None:
        deadline = time.monotonic() + limit_s
        while True:
            try:
                probe()
                return
            except httpx.TransportError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server {self.proc.args} did not start") from None
                time.sleep(0.2)

    def sigterm(self, limit_s: float = 30) -> dict[str, Any]:
        """SIGTERM; seconds until the process is gone (SIGKILL after ``limit_s``: ``stopped`` false)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=limit_s)
            return {"stopped": True, "seconds": round(time.monotonic() - t0, 2), "exit_status": code}
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return {"stopped": False, "seconds": None, "killed_after_s": limit_s}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    try:
        out = fn()
    except httpx.HTTPError as err:
        out = type(err).__name__
    return time.perf_counter() - t0, out


def _latency(fn: Any, n: int) -> dict[str, Any]:
    runs = [_timed(fn) for _ in range(n)]
    ok = [t for t, r in runs if isinstance(r, httpx.Response) and r.status_code == 200]
    return {"median_s": round(statistics.median(ok), 4) if ok else None, "ok": len(ok), "of": n,
            "failures": sorted({r if isinstance(r, str) else str(r.status_code) for _, r in runs} - {"200"})}  # fmt: skip


def _concurrent(fn: Any, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda _: _timed(fn)[1], range(n)))
    codes: dict[str, int] = {}
    for r in results:
        key = r if isinstance(r, str) else str(r.status_code)
        codes[key] = codes.get(key, 0) + 1
    return {"clients": n, "wall_s": round(time.perf_counter() - t0, 3), "statuses": codes}


def _reply(resp: Any) -> dict[str, Any]:
    if isinstance(resp, str):
        return {"status": resp}
    out: dict[str, Any] = {"status": resp.status_code, "body_bytes": len(resp.content)}
    try:
        body = resp.json()
        err = body.get("error") if isinstance(body, dict) else None
        out["error"] = (err or {}).get("message", "")[:160] if err else str(body.get("detail", ""))[:160] or None
    except ValueError:
        out["text"] = resp.text[:160]
    return out


def _drop_stream(url: str, body: dict[str, Any]) -> str:
    """Open a stream, read its first line, drop the connection."""
    try:
        with httpx.stream("POST", url, json=body, timeout=30) as resp:
            for _ in resp.iter_lines():
                break
        return "dropped"
    except httpx.HTTPError as err:
        return type(err).__name__


def _post_quietly(url: str, body: dict[str, Any], timeout: float) -> None:
    try:
        httpx.post(url, json=body, timeout=timeout)
    except httpx.HTTPError:
        pass


def probe_serve(args: argparse.Namespace) -> dict[str, Any]:
    server = Server(["serve", "--model", args.model], args.server_pythonpath)
    url = f"{server.base}/v1/chat/completions"
    try:
        server.wait_ready(lambda: httpx.get(f"{server.base}/v1/models", timeout=5).raise_for_status())

        def chat(content: str = "What is 2 + 3?", timeout: float = 60, **kw: Any) -> Any:
            body = {"model": args.model, "messages": [{"role": "user", "content": content}], "max_tokens": 32, **kw}
            return httpx.post(url, json=body, timeout=timeout)

        out: dict[str, Any] = {"model": args.model}
        chat()  # warm-up
        out["normal_before"] = _latency(chat, args.normal)
        out["concurrent"] = _concurrent(chat, args.clients)
        bad: dict[str, Any] = {}
        bad["max_tokens_0"] = _reply(_timed(lambda: chat(max_tokens=0))[1])
        bad["max_tokens_1e9"] = _reply(_timed(lambda: chat(max_tokens=10**9))[1])
        bad["temperature_1e9"] = _reply(_timed(lambda: chat(temperature=1e9))[1])
        bad["unknown_role"] = _reply(_timed(lambda: httpx.post(url, json={"model": args.model, "messages": [
            {"role": "wizard", "content": "hi"}]}, timeout=60))[1])  # fmt: skip
        bad["malformed_json"] = _reply(_timed(lambda: httpx.post(url, content=b'{"model": ', timeout=60,
                                                                 headers={"content-type": "application/json"}))[1])  # fmt: skip
        if not args.skip_oversized:
            t, r = _timed(lambda: chat("word " * 80_000, timeout=args.request_timeout))  # 400 kB, ~80k tokens
            bad["prompt_400kB_over_context"] = {**_reply(r), "seconds": round(t, 3)}
            t, r = _timed(lambda: chat("x" * 2_000_000, timeout=args.request_timeout))  # 2 MB body
            bad["body_2MB"] = {**_reply(r), "seconds": round(t, 3)}
        out["bad_requests"] = bad
        long = {"model": args.model, "messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 4000, "temperature": 1.0}  # fmt: skip
        t0 = time.perf_counter()
        dropped = [_drop_stream(url, {**long, "stream": True}) for _ in range(args.abandoned)]
        timeouts = [_timed(lambda: httpx.post(url, json=long, timeout=0.5))[1] for _ in range(args.abandoned)]
        out["abandoned"] = {"streams_dropped": dropped.count("dropped"),
                            "clients_timed_out_at_0.5s": sum(1 for r in timeouts if r == "ReadTimeout"),
                            "seconds": round(time.perf_counter() - t0, 2)}  # fmt: skip
        out["normal_right_after"] = _latency(chat, 1)
        out["normal_after"] = _latency(chat, args.normal)
        before, after = out["normal_before"]["median_s"], out["normal_after"]["median_s"]
        out["after_over_before"] = round(after / before, 2) if before and after else None
        out["rss_mb"] = _rss_mb(server.proc.pid)
        stream = threading.Thread(target=_drop_stream, args=(url, {**long, "stream": True, "max_tokens": 8000}))
        stream.start()
        time.sleep(1.0)
        out["sigterm_with_a_stream_in_flight"] = server.sigterm()
        stream.join(timeout=60)
        return out
    finally:
        server.kill()


def probe_retrieval(args: argparse.Namespace) -> dict[str, Any]:
    from drmas_envs.search.corpus import save_corpus_jsonl
    from drmas_envs.search.synthetic import EncyclopediaConfig, generate_encyclopedia

    tmp = Path(tempfile.mkdtemp(prefix="drmas-faults-"))
    corpus = save_corpus_jsonl(generate_encyclopedia(EncyclopediaConfig()).passages, tmp / "wiki.jsonl")
    server = Server(["retrieval-server", "--corpus", str(corpus), "--retriever", "bm25", "--cache-dir",
                     str(tmp / "cache"), "--log-level", "warning"], args.server_pythonpath)  # fmt: skip
    url = f"{server.base}/retrieve"
    try:
        server.wait_ready(lambda: httpx.get(f"{server.base}/health", timeout=5).raise_for_status())

        def small(timeout: float = 60) -> Any:
            return httpx.post(url, json={"query": "founder of a robotics company", "topk": 3}, timeout=timeout)

        out: dict[str, Any] = {"retriever": "bm25", "passages": httpx.get(f"{server.base}/health").json()["num_passages"]}
        small()
        out["normal_before"] = _latency(small, args.normal * 4)
        out["concurrent"] = _concurrent(small, args.clients * 10)
        big_queries = [f"who founded company {i} and where is its robotics lab" for i in range(4096)]
        t, r = _timed(lambda: httpx.post(url, json={"queries": big_queries, "topk": 10}, timeout=args.request_timeout))
        out["one_4096_query_request_s"] = round(t, 3) if isinstance(r, httpx.Response) and r.status_code == 200 else _reply(r)
        bad: dict[str, Any] = {}
        bad["queries_5000"] = _reply(_timed(lambda: httpx.post(url, json={"queries": ["q"] * 5000}, timeout=60))[1])
        if not args.skip_oversized:
            huge = {"queries": ["x" * 4000] * 4096}  # 16 MB
            t, r = _timed(lambda: httpx.post(url, json=huge, timeout=args.request_timeout))
            bad["body_16MB"] = {**_reply(r), "seconds": round(t, 3)}
        out["bad_requests"] = bad
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.abandoned * 2) as pool:
            timed_out = list(pool.map(lambda _: _timed(lambda: httpx.post(
                url, json={"queries": big_queries, "topk": 50}, timeout=0.3))[1], range(args.abandoned * 2)))  # fmt: skip
        out["abandoned"] = {"clients_timed_out_at_0.3s": sum(1 for r in timed_out if r == "ReadTimeout"),
                            "queries_each": len(big_queries), "seconds": round(time.perf_counter() - t0, 2)}  # fmt: skip
        out["normal_right_after"] = _latency(lambda: small(timeout=args.request_timeout), 1)
        out["normal_after"] = _latency(small, args.normal * 4)
        before, after = out["normal_before"]["median_s"], out["normal_after"]["median_s"]
        out["after_over_before"] = round(after / before, 2) if before and after else None
        out["rss_mb"] = _rss_mb(server.proc.pid)
        threads = [threading.Thread(target=_post_quietly, args=(url, {"queries": big_queries, "topk": 50}, 60))
                   for _ in range(4)]  # fmt: skip
        for th in threads:
            th.start()
        time.sleep(0.5)
        out["sigterm_with_4_requests_in_flight"] = server.sigterm()
        for th in threads:
            th.join(timeout=60)
        return out
    finally:
        server.kill()


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-qwen3", help="named model served by drmas serve")
    p.add_argument("--normal", type=int, default=5, help="normal requests timed before and after the faults")
    p.add_argument("--clients", type=int, default=20, help="concurrent chat clients (x10 for retrieval)")
    p.add_argument("--abandoned", type=int, default=5, help="abandoned requests of each kind")
    p.add_argument("--request-timeout", type=float, default=60.0, help="client timeout of the long requests (s)")
    p.add_argument("--server-pythonpath", default=None, help="PYTHONPATH of the servers (another checkout)")
    p.add_argument("--skip-oversized", action="store_true", help="skip the 400 kB prompt and 2 / 16 MB bodies")
    p.add_argument("--only", choices=["serve", "retrieval"], default=None)
    args = p.parse_args(argv)
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                          "load_avg_start": _load()},
                              "server_pythonpath": args.server_pythonpath}  # fmt: skip
    if args.only in (None, "serve"):
        result["serve"] = probe_serve(args)
    if args.only in (None, "retrieval"):
        result["retrieval_server"] = probe_retrieval(args)
    result["machine"]["load_avg_end"] = _load()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
