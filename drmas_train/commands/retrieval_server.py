"""``drmas retrieval-server``: serve a local retriever over HTTP (Search-R1 / Dr. MAS ``/retrieve`` protocol).

    drmas retrieval-server --corpus wiki-18.jsonl --retriever bm25 --port 8000
    drmas retrieval-server --corpus ../shared/data/hotpotqa_dev_distractor_100.jsonl --retriever dense

Envs then share the index with ``retriever="http", retriever_kwargs={"url": "http://127.0.0.1:8000/retrieve"}``.
All logic lives in :mod:`drmas_envs.search.server`; this module only parses arguments.
"""

from __future__ import annotations

import argparse

from drmas_envs.search.retrievers import RETRIEVERS
from drmas_train.commands import HelpFormatter


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drmas retrieval-server", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--corpus", default="synthetic",
                   help="'synthetic' (default encyclopedia), a wiki-18 JSONL {id, contents}, or a HotpotQA file")
    p.add_argument("--retriever", default="bm25", choices=sorted(set(RETRIEVERS) - {"http"}), help="index type")
    p.add_argument("--model", default=None, help="dense: sentence-transformers dir or id (default: offline all-MiniLM-L6-v2)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback only by default)")
    p.add_argument("--port", type=int, default=8000, help="TCP port")
    p.add_argument("--topk", type=int, default=3, help="results per query when a request gives no topk")
    p.add_argument("--cache-dir", default=None, help="index cache root (default $DRMAS_CACHE_DIR or ~/.cache/drmas)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn log level")
    return p


def main(argv: list[str]) -> int:
    """Parse ``argv``, build the retriever, serve until interrupted; returns the exit code."""
    args = _parser().parse_args(argv)
    from drmas_envs.search.retrievers import make_retriever
    from drmas_envs.search.server import serve
    from drmas_envs.search.sources import load_corpus

    passages = load_corpus(args.corpus)
    kwargs = {"cache_dir": args.cache_dir}
    if args.retriever == "dense" and args.model:
        kwargs["model"] = args.model
    retriever = make_retriever(args.retriever, passages, **kwargs)
    print(f"drmas retrieval-server: {args.retriever} over {len(passages)} passages at "
          f"http://{args.host}:{args.port}/retrieve", flush=True)
    serve(retriever, host=args.host, port=args.port, default_topk=args.topk, log_level=args.log_level)
    return 0
