"""Search performance, printed as one JSON object:

* BM25 (bm25s) index build time and batched top-3 query latency on a ~100k-passage synthetic encyclopedia
  (target < 2 ms/query), cold build and warm load from the on-disk cache;
* the same queries through the HTTP retrieval server (real sockets on 127.0.0.1) for comparison;
* env step overhead of ``search-orchestrator-v0`` and ``search-r1-v0`` excluding the LLM (scripted oracle actions,
  default synthetic corpus; per env.step including retrieval and observation building).

    python benchmarks/search/perf.py                 # 100k passages (a few minutes on 2 cores)
    python benchmarks/search/perf.py --passages 20000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 4)


def bm25_perf(num_passages: int, num_queries: int, cache: str) -> dict:
    """Build/load times and per-query latency for several batch sizes."""
    from drmas_envs.search.retrievers.bm25 import BM25Retriever
    from drmas_envs.search.synthetic import EncyclopediaConfig, generate_encyclopedia

    cfg = EncyclopediaConfig(seed=0, num_people=int(num_passages * 0.6), num_cities=int(num_passages * 0.15),
                             num_companies=num_passages - int(num_passages * 0.6) - int(num_passages * 0.15),
                             num_questions=num_queries)
    start = time.perf_counter()
    enc = generate_encyclopedia(cfg)
    generate_s = time.perf_counter() - start
    queries = [t.question for t in enc.tasks]
    start = time.perf_counter()
    retriever = BM25Retriever(enc.passages, cache_dir=cache)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    warm = BM25Retriever(enc.passages, cache_dir=cache)
    load_s = time.perf_counter() - start
    if not warm.loaded_from_cache:
        raise RuntimeError(f"the BM25 index was not cached under {cache}")
    retriever.search(queries[:8], 3)  # warm-up
    latency, cpu = {}, {}
    for batch in (1, 16, 256, len(queries)):
        start, cpu_start = time.perf_counter(), time.process_time()
        done = 0
        for i in range(0, min(len(queries), max(batch * 8, 256)), batch):
            chunk = queries[i : i + batch]
            retriever.search(chunk, 3)
            done += len(chunk)
        latency[f"batch_{batch}"] = _ms((time.perf_counter() - start) / done)
        cpu[f"batch_{batch}"] = _ms((time.process_time() - cpu_start) / done)
    words = sum(len(p.text.split()) for p in enc.passages)
    return {
        "num_passages": len(enc.passages),
        "corpus_words": words,
        "generate_corpus_s": round(generate_s, 2),
        "build_index_s": round(build_s, 2),
        "load_cached_index_s": round(load_s, 2),
        "query_ms_per_query_top3": latency,
        "query_cpu_ms_per_query_top3 (process CPU time: the unloaded-machine proxy)": cpu,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "target_ms_per_query": 2.0,
        "meets_target_batched_wall": latency[f"batch_{len(queries)}"] < 2.0,
        "meets_target_batched_cpu": cpu[f"batch_{len(queries)}"] < 2.0,
        "_retriever": retriever,
        "_queries": queries,
    }


def http_perf(retriever, queries: list[str], cache: str) -> dict:
    """Per-query latency through ``drmas retrieval-server`` run as a separate process (as env workers would use
    it) over the same corpus; the server loads the BM25 index from the shared on-disk cache."""
    import socket
    import subprocess

    import httpx

    from drmas_envs.search.corpus import save_corpus_jsonl
    from drmas_envs.search.retrievers.http import HTTPRetriever

    corpus = save_corpus_jsonl(retriever.passages, os.path.join(cache, "corpus.jsonl"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "drmas_train.cli", "retrieval-server", "--corpus", str(corpus), "--port", str(port),
           "--cache-dir", cache, "--log-level", "warning"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.perf_counter() - start > 300:
                    raise RuntimeError(f"retrieval server did not start: {proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.2)
        startup_s = time.perf_counter() - start
        client = HTTPRetriever(f"http://127.0.0.1:{port}/retrieve", timeout=60)
        same = client.search(queries[:64], 3) == retriever.search(queries[:64], 3)
        out = {}
        for batch in (1, 256):
            n = 128 if batch == 1 else 1024
            start = time.perf_counter()
            for i in range(0, n, batch):
                client.search(queries[i : i + batch], 3)
            out[f"batch_{batch}"] = _ms((time.perf_counter() - start) / n)
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"server_startup_s (load corpus + cached index)": round(startup_s, 2), "same_results_as_in_process": same,
            "query_ms_per_query_top3": out}


def env_perf(episodes: int) -> dict:
    """Mean wall time of ``make``, ``reset`` and ``step`` (scripted oracle: no LLM) per env id."""
    import drmas_envs

    out = {}
    scripts = {
        "search-orchestrator-v0": lambda t: ["<verify>no</verify>", f"<think>look it up</think><search>{t.question}</search>",
                                             "<verify>yes</verify>", f"<think>found</think><answer>{t.answers[0]}</answer>"],
        "search-r1-v0": lambda t: [f"<think>look it up</think><search>{t.question}</search>",
                                   f"<answer>{t.answers[0]}</answer>"],
    }
    for env_id, script in scripts.items():
        start = time.perf_counter()
        env = drmas_envs.make(env_id)
        first_make = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(8):
            drmas_envs.make(env_id)
        make_s = (time.perf_counter() - start) / 8
        step_times, search_step_times, reset_times, obs_times, ems = [], [], [], [], 0.0
        for i in range(episodes):
            t0 = time.perf_counter()
            env.reset(options={"task_index": i % len(env.unwrapped.tasks)})
            reset_times.append(time.perf_counter() - t0)
            for action in script(env.unwrapped.task):
                t0 = time.perf_counter()
                env.observe(env.agent_selection)
                obs_times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                env.step(action)
                dt = time.perf_counter() - t0
                step_times.append(dt)
                if "<search>" in action:
                    search_step_times.append(dt)
            ems += env.unwrapped.infos[env.possible_agents[-1]]["em"]
        out[env_id] = {
            "episodes": episodes,
            "oracle_em": ems / episodes,
            "first_make_s (builds the default index)": round(first_make, 3),
            "make_ms (shared index)": _ms(make_s),
            "reset_ms": _ms(statistics.mean(reset_times)),
            "observe_ms": _ms(statistics.mean(obs_times)),
            "step_ms_mean": _ms(statistics.mean(step_times)),
            "step_ms_search_steps": _ms(statistics.mean(search_step_times)),
            "step_ms_p99": _ms(sorted(step_times)[int(0.99 * (len(step_times) - 1))]),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--no-http", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("DRMAS_CACHE_DIR", tempfile.mkdtemp(prefix="drmas-perf-"))

    result = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}}
    cache = tempfile.mkdtemp(prefix="drmas-bm25-perf-")
    try:
        bm25 = bm25_perf(args.passages, args.queries, cache)
        retriever, queries = bm25.pop("_retriever"), bm25.pop("_queries")
        result["bm25"] = bm25
        if not args.no_http:
            result["http_server_bm25"] = http_perf(retriever, queries, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    result["env_step_overhead"] = env_perf(args.episodes)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
