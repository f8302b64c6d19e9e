"""``drmas retrieval-server``: serve a retriever over HTTP (the Dr. MAS reference / Search-R1 ``/retrieve`` protocol).

    # the paper's retrieval: the prebuilt e5 index of wiki-18 (drmas data prepare wiki18), no re-embedding
    drmas retrieval-server --index data/wiki18/e5_Flat.index --corpus data/wiki18/wiki-18.jsonl \\
        --model intfloat/e5-base-v2 --device cuda --port 8000
    # small corpora, CPU, built in process
    drmas retrieval-server --corpus wiki-18-sample.jsonl --retriever bm25 --port 8000
    drmas retrieval-server --corpus ../shared/data/hotpotqa_dev_distractor_100.jsonl --retriever dense

Envs then share the index with ``retriever="http", retriever_kwargs={"url": "http://127.0.0.1:8000/retrieve"}``
(the server takes the reference's one-query body and Search-R1's batch). Bodies over ``--max-body-bytes`` get HTTP 413,
a client that disconnects has its search stopped, more than ``--max-pending`` requests in progress get HTTP 503, and
SIGTERM stops the server within ``--shutdown-timeout`` seconds plus one search call. All logic lives in
:mod:`drmas_envs.search.server` and the retrievers; this module only parses arguments. Bad arguments or files exit
with status 2 and one line.
"""

from __future__ import annotations

import argparse
import sys

from drmas_envs.search.retrievers import RETRIEVERS, RetrieverError
from drmas_train.commands import HelpFormatter, doc_summary


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drmas retrieval-server", description=doc_summary(__doc__),
                                formatter_class=HelpFormatter)
    p.add_argument("--corpus", default="synthetic",
                   help="'synthetic' (default encyclopedia), a wiki-18 JSONL {id, contents}, or a HotpotQA file; "
                        "with --index, the JSONL the index was built from (row i = vector i)")
    p.add_argument("--retriever", default=None, choices=sorted(set(RETRIEVERS) - {"http"}),
                   help="index type (default: faiss with --index, else bm25)")
    p.add_argument("--index", default=None,
                   help="a prebuilt FAISS index (e.g. e5_Flat.index); queries are embedded as the reference server does")
    p.add_argument("--model", default=None,
                   help="dense: sentence-transformers dir or id (default: offline all-MiniLM-L6-v2); faiss: the query "
                        "encoder the index was built with (default: intfloat/e5-base-v2)")
    p.add_argument("--encoder-name", default=None,
                   help="faiss: the reference's --retriever_name, which picks the query prefix ('e5' -> 'query: ') "
                        "and normalisation (default: 'e5' if the model path holds 'e5')")
    p.add_argument("--pooling", default="mean", choices=["mean", "cls", "pooler"], help="faiss: query pooling")
    p.add_argument("--max-length", type=int, default=256, help="faiss: query tokens kept (the reference's)")
    p.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=None,
                   help="faiss: encode queries in half precision (default: on CUDA only; the reference: on)")
    p.add_argument("--device", default="cpu", help="faiss: torch device of the query encoder (cpu, cuda, ...)")
    p.add_argument("--faiss-gpu", action="store_true", help="faiss: shard the index over all GPUs in fp16")
    p.add_argument("--mmap", action="store_true", help="faiss: map the index from disk instead of loading it")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback only by default)")
    p.add_argument("--port", type=int, default=8000, help="TCP port")
    p.add_argument("--topk", type=int, default=3, help="results per query when a request gives no topk")
    p.add_argument("--cache-dir", default=None, help="index / offsets cache root (default $DRMAS_CACHE_DIR or ~/.cache/drmas)")
    p.add_argument("--max-body-bytes", type=int, default=8 * 2**20,
                   help="largest request body in bytes; larger ones are refused with HTTP 413")
    p.add_argument("--workers", type=int, default=4, help="threads that run searches (64 queries per search call)")
    p.add_argument("--max-pending", type=int, default=1024,
                   help="requests in progress beyond which HTTP 503 is answered (HTTP clients retry it)")
    p.add_argument("--shutdown-timeout", type=float, default=3.0,
                   help="seconds SIGTERM / Ctrl-C waits for requests in progress before cancelling them")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn log level")
    return p


def _build(args: argparse.Namespace):  # noqa: ANN202 - a Retriever
    from drmas_envs.search.retrievers import make_retriever
    from drmas_envs.search.sources import load_corpus

    retriever = args.retriever or ("faiss" if args.index else "bm25")
    if retriever == "faiss":
        if not args.index:
            raise ValueError("--retriever faiss needs --index <prebuilt .index file>")
        if args.corpus == "synthetic":
            raise ValueError("--index needs --corpus <the JSONL the index was built from> (e.g. wiki-18.jsonl)")
        kwargs = {"index": args.index, "model": args.model or "intfloat/e5-base-v2", "encoder_name": args.encoder_name,
                  "pooling": args.pooling, "max_length": args.max_length, "fp16": args.fp16, "device": args.device,
                  "faiss_gpu": args.faiss_gpu, "mmap": args.mmap, "cache_dir": args.cache_dir}  # fmt: skip
        return make_retriever("faiss", args.corpus, **kwargs)
    if args.index:
        raise ValueError(f"--index serves a prebuilt FAISS index (--retriever faiss), not --retriever {retriever}")
    kwargs = {"cache_dir": args.cache_dir}
    if retriever == "dense" and args.model:
        kwargs["model"] = args.model
    return make_retriever(retriever, load_corpus(args.corpus), **kwargs)


def main(argv: list[str]) -> int:
    """Parse ``argv``, build the retriever, serve until interrupted; returns the exit code."""
    args = _parser().parse_args(argv)
    from drmas_envs.search.server import serve

    for name in ("max_body_bytes", "workers", "max_pending"):
        if getattr(args, name) < 1:
            print(f"drmas retrieval-server: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}",
                  file=sys.stderr)  # fmt: skip
            return 2
    try:
        retriever = _build(args)
    except (FileNotFoundError, ValueError, RetrieverError) as err:
        print(f"drmas retrieval-server: {err}", file=sys.stderr)
        return 2
    print(f"drmas retrieval-server: {retriever.name} over {len(retriever.passages)} passages at "
          f"http://{args.host}:{args.port}/retrieve", flush=True)
    serve(retriever, host=args.host, port=args.port, default_topk=args.topk, log_level=args.log_level,
          shutdown_timeout=args.shutdown_timeout, max_body_bytes=args.max_body_bytes, workers=args.workers,
          max_pending=args.max_pending)  # fmt: skip
    return 0
