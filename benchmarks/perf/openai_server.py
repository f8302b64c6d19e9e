"""The OpenAI-compatible server (``drmas_train.serving.openai_server``): wall time of N chat requests sent one
after another vs all at once, and the batched backend calls each made, printed as one JSON object.

Concurrent requests that arrive within ``--batch-window-s`` of each other (or while a call runs) share one
batched ``generate`` call; tests/drmas_train/serving/test_openai_server.py checks that they do (by counting calls), this script
measures what it saves.

    python benchmarks/perf/openai_server.py                              # tiny-llama, 8 requests, 48 tokens
    python benchmarks/perf/openai_server.py --model smollm2-135m-instruct --repeats 3

Medians over ``--repeats`` alternating serial and concurrent rounds; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import runpy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# ``benchmarks`` is no package: the sibling local_server.py (uvicorn in a thread) is run by path
serve_in_thread = runpy.run_path(
    str(Path(__file__).with_name("local_server.py")), run_name="drmas_bench_local_server"
)["serve_in_thread"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-llama", help="named model, local path or HF id")
    p.add_argument("--requests", type=int, default=8, help="chat requests per round")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--batch-window-s", type=float, default=0.05)
    p.add_argument("--repeats", type=int, default=3, help="serial + concurrent rounds; medians reported")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.requests < 1 or args.repeats < 1 or args.max_tokens < 1:
        p.error("need --requests, --repeats and --max-tokens >= 1")

    import httpx
    import torch

    from drmas_train.backends.hf import HFBackend
    from drmas_train.model.models import load_model
    from drmas_train.serving.openai_server import create_app

    torch.set_num_threads(args.threads)
    app = create_app(HFBackend.from_loaded(load_model(args.model)), "m", batch_window_s=args.batch_window_s)
    batcher = app.state.batcher
    with serve_in_thread(app) as base:
        url = f"{base}/v1/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}],
                "max_tokens": args.max_tokens, "temperature": 1.0}  # fmt: skip

        def one(client: httpx.Client) -> int:
            reply = client.post(url, json=body, timeout=600)
            reply.raise_for_status()
            return int(reply.json()["usage"]["completion_tokens"])

        def round_(at_once: bool) -> dict[str, Any]:
            calls0 = batcher.backend_calls
            with httpx.Client(trust_env=False, limits=httpx.Limits(max_connections=args.requests)) as client:
                start = time.perf_counter()
                if at_once:
                    with concurrent.futures.ThreadPoolExecutor(args.requests) as pool:
                        tokens = list(pool.map(lambda _: one(client), range(args.requests)))
                else:
                    tokens = [one(client) for _ in range(args.requests)]
                wall = time.perf_counter() - start
            return {"wall_s": wall, "backend_calls": batcher.backend_calls - calls0, "tokens": sum(tokens)}

        with httpx.Client(trust_env=False) as warm:
            one(warm)  # warm-up (first forward, allocator)
        runs: dict[str, list[dict[str, Any]]] = {"serial": [], "concurrent": []}
        for _ in range(args.repeats):
            runs["serial"].append(round_(False))
            runs["concurrent"].append(round_(True))
    out: dict[str, Any] = {"model": args.model, "requests": args.requests, "max_tokens": args.max_tokens,
                           "batch_window_s": args.batch_window_s}  # fmt: skip
    for kind, rs in runs.items():
        out[kind] = {"wall_s": round(statistics.median(r["wall_s"] for r in rs), 3),
                     "wall_s_runs": [round(r["wall_s"], 3) for r in rs],
                     "backend_calls_runs": [r["backend_calls"] for r in rs],
                     "completion_tokens_runs": [r["tokens"] for r in rs]}  # fmt: skip
    out["speedup_concurrent_vs_serial"] = round(out["serial"]["wall_s"] / out["concurrent"]["wall_s"], 2)
    out["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                      "load_average_1min": round(os.getloadavg()[0], 2)}  # fmt: skip
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
