"""Recall@k of the gold supporting paragraphs, BM25 and dense, on HotpotQA dev (distractor, 100 questions;
corpus = the union of their context paragraphs) and on the synthetic encyclopedia (default config).

The query is the question itself (what the oracle policy searches). Per question, recall@k = share of its gold
supporting titles among the top-k retrieved titles; ``all@k`` = share of questions with *every* gold title in the
top k. Prints one JSON object.

    python benchmarks/search/recall.py                      # BM25 + dense, k = 3
    python benchmarks/search/recall.py --no-dense --k 3 5
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

SHARED = Path(os.environ.get("DRMAS_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


def recall_table(retriever, tasks, ks: list[int]) -> dict:
    """Mean recall@k and all@k overall and per question type."""
    questions = [t.question for t in tasks]
    start = time.perf_counter()
    hits = retriever.search(questions, max(ks))
    seconds = time.perf_counter() - start
    rows: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for task, ranked in zip(tasks, hits, strict=True):
        gold = set(task.extra["supporting_titles"])
        for k in ks:
            got = {p.title for p in ranked[:k]}
            for group in ("all", str(task.extra.get("type"))):
                rows[group][f"recall@{k}"].append(len(gold & got) / len(gold))
                rows[group][f"all@{k}"].append(float(gold <= got))
    out = {g: {m: round(sum(v) / len(v), 4) for m, v in metrics.items()} | {"n": len(next(iter(metrics.values())))}
           for g, metrics in sorted(rows.items())}
    out["query_seconds"] = round(seconds, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, nargs="+", default=[3])
    parser.add_argument("--no-dense", action="store_true", help="skip the dense retriever (needs drmas[dense])")
    args = parser.parse_args(argv)

    from drmas_envs.search.retrievers import make_retriever
    from drmas_envs.search.sources import resolve_data

    datasets = {"synthetic_encyclopedia": resolve_data(None, None, None)}
    hotpot = SHARED / "hotpotqa_dev_distractor_100.jsonl"
    if hotpot.is_file():
        datasets["hotpotqa_dev_distractor_100"] = resolve_data(str(hotpot), None, None)
    else:
        print(f"(skipping HotpotQA: {hotpot} not found)", file=sys.stderr)
    names = ["bm25"] + ([] if args.no_dense else ["dense"])
    if "dense" in names:
        import torch

        torch.set_num_threads(2)
    result: dict = {"k": args.k, "query": "the question text", "results": {}}
    for dname, (tasks, passages) in datasets.items():
        result["results"][dname] = {"num_passages": len(passages), "num_questions": len(tasks)}
        for rname in names:
            start = time.perf_counter()
            retriever = make_retriever(rname, passages, cache_dir=False)
            build = time.perf_counter() - start
            table = recall_table(retriever, list(tasks), args.k)
            table["build_seconds"] = round(build, 2)
            if rname == "dense":
                table["model"] = Path(retriever.model_name).name
            result["results"][dname][rname] = table
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
