"""Serving a prebuilt FAISS index as the Dr. MAS reference's retrieval server does (issue 20, item 2).

A tiny flat inner-product index is built here the way the paper's ``e5_Flat.index`` was (passages embedded with a
``passage: `` prefix, mean pooling, L2 normalisation), with the offline all-MiniLM-L6-v2 standing in for
e5-base-v2. ``reference_encode`` re-implements the reference server's ``Encoder.encode`` from
``langfengQ/DrMAS examples/search/retriever/retrieval_server.py:46-110`` (with its launch settings, :372-383:
retriever name "e5", mean pooling, max length 256), to check that drmas embeds queries exactly so.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from drmas_envs.search.corpus import save_corpus_jsonl  # noqa: E402
from drmas_envs.search.retrievers import RetrieverError, make_retriever  # noqa: E402
from drmas_envs.search.retrievers.dense import default_embedder_path  # noqa: E402
from drmas_envs.search.retrievers.faiss_index import FaissIndexRetriever, JsonlCorpus  # noqa: E402
from drmas_envs.search.retrievers.http import HTTPRetriever  # noqa: E402
from drmas_envs.search.synthetic import EncyclopediaConfig, generate_encyclopedia  # noqa: E402

QUERIES = ["Dormonlo Systems", "who founded a robotics company", "capital city", ""]


def reference_encode(model, tokenizer, texts, *, is_query, name="e5", max_length=256):
    """retrieval_server.py:70-110 with pooling_method="mean" (:46-55), on CPU in fp32."""
    if "e5" in name.lower():
        texts = [f"query: {t}" if is_query else f"passage: {t}" for t in texts]
    inputs = tokenizer(texts, max_length=max_length, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        output = model(**inputs, return_dict=True)
        last_hidden = output.last_hidden_state.masked_fill(~inputs["attention_mask"][..., None].bool(), 0.0)
        emb = last_hidden.sum(dim=1) / inputs["attention_mask"].sum(dim=1)[..., None]
        if "dpr" not in name.lower():
            emb = torch.nn.functional.normalize(emb, dim=-1)
    return emb.numpy().astype(np.float32, order="C")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(dir, corpus path, index path, passages, reference passage embeddings, reference model, tokenizer)."""
    root = tmp_path_factory.mktemp("faiss")
    passages = list(generate_encyclopedia(EncyclopediaConfig()).passages)[:60]
    corpus = save_corpus_jsonl(passages, root / "wiki.jsonl")
    model_dir = str(default_embedder_path())
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, use_fast=True)
    emb = reference_encode(model, tokenizer, [p.contents for p in passages], is_query=False)
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(emb)
    faiss.write_index(index, str(root / "e5_Flat.index"))
    return root, corpus, root / "e5_Flat.index", passages, emb, model, tokenizer


@pytest.fixture(scope="module")
def retriever(built):
    root, corpus, index, *_ = built
    return FaissIndexRetriever(index, corpus, model=default_embedder_path(), encoder_name="e5",
                               cache_dir=root / "cache")  # fmt: skip


@pytest.mark.slow  # loads a 22M-parameter encoder and embeds the corpus (~20-30 s on 2 shared cores)
def test_query_embedding_is_the_reference_recipe(built, retriever):
    *_, model, tokenizer = built
    expected = reference_encode(model, tokenizer, QUERIES, is_query=True)
    got = retriever.encoder.encode(QUERIES)
    assert got.dtype == np.float32 and got.flags["C_CONTIGUOUS"] and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(
        np.linalg.norm(got, axis=1), 1.0, atol=1e-5
    )  # normalised (retrieval_server.py:104-105)
    no_prefix = reference_encode(model, tokenizer, QUERIES, is_query=True, name="minilm")  # no "query: "
    assert not np.allclose(
        got, no_prefix, atol=1e-3
    )  # the prefix matters: a recipe without it would fail above
    assert (retriever.encoder.query_prefix, retriever.encoder.pooling, retriever.encoder.max_length) == (
        "query: ",
        "mean",
        256,
    )


@pytest.mark.slow  # loads a 22M-parameter encoder and embeds the corpus (~20-30 s on 2 shared cores)
def test_retrieval_returns_the_index_s_nearest_passages(built, retriever):
    _, _, _, passages, emb, model, tokenizer = built
    q = reference_encode(model, tokenizer, QUERIES, is_query=True)
    scores = q @ emb.T
    for i, hits in enumerate(retriever.search(QUERIES, 5)):
        best = np.argsort(-scores[i], kind="stable")[:5]
        assert [p.id for p in hits] == [passages[j].id for j in best]
        assert [p.score for p in hits] == pytest.approx(scores[i][best].tolist(), abs=1e-5)
        assert all(p == passages[j].with_score(p.score) for p, j in zip(hits, best, strict=True))
    # a passage's own text finds it first
    target = passages[17]
    assert retriever.search([target.text], 1)[0][0].id == target.id


@pytest.mark.slow  # loads a 22M-parameter encoder and embeds the corpus (~20-30 s on 2 shared cores)
def test_mmap_gives_the_same_results(built, retriever):
    root, corpus, index, *_ = built
    mapped = FaissIndexRetriever(index, corpus, model=default_embedder_path(), encoder_name="e5", mmap=True,
                                 cache_dir=root / "cache")  # fmt: skip
    assert mapped.search(QUERIES, 3) == retriever.search(QUERIES, 3)


@pytest.mark.slow  # loads a 22M-parameter encoder and embeds the corpus (~20-30 s on 2 shared cores)
def test_index_and_corpus_must_come_from_the_same_build(built, tmp_path):
    _, _, index, passages, *_ = built
    short = save_corpus_jsonl(passages[:10], tmp_path / "short.jsonl")
    with pytest.raises(RetrieverError, match=r"holds 60 vectors but the corpus .* has 10 rows"):
        FaissIndexRetriever(index, short, model=default_embedder_path(), encoder_name="e5", cache_dir=False)
    wrong_dim = faiss.IndexFlatIP(8)
    wrong_dim.add(np.zeros((60, 8), dtype=np.float32))
    faiss.write_index(wrong_dim, str(tmp_path / "d8.index"))
    with pytest.raises(RetrieverError, match=r"gives 384-d vectors but the index .* holds 8-d ones"):
        FaissIndexRetriever(tmp_path / "d8.index", built[1], model=default_embedder_path(), cache_dir=False)


def test_jsonl_corpus_rows_offsets_and_cache(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [
        {"id": "a", "contents": '"A"\nalpha'},
        {"id": "b", "contents": '"B"\nbeta é'},
        {"id": "c", "contents": "gamma"},
    ]
    path.write_bytes(
        (
            "\n".join(json.dumps(r, ensure_ascii=False) for r in rows[:2]) + "\n\n" + json.dumps(rows[2])
        ).encode()
    )
    corpus = JsonlCorpus(path, cache_dir=tmp_path / "cache")
    assert len(corpus) == 3 and [p.id for p in corpus] == [
        "a",
        "b",
        "c",
    ]  # blank line skipped, no final newline
    assert (corpus[1].title, corpus[1].text, corpus[-1].text) == ("B", "beta é", "gamma")
    assert list((tmp_path / "cache" / "corpus-offsets").glob("c.jsonl-*.npy"))
    again = JsonlCorpus(path, cache_dir=tmp_path / "cache")
    assert [p.id for p in again[0:3]] == ["a", "b", "c"]
    with pytest.raises(IndexError, match="row 3 out of range for a corpus of 3 rows"):
        corpus[3]


@pytest.mark.slow  # loads a 22M-parameter encoder and embeds the corpus (~20-30 s on 2 shared cores)
def test_make_retriever_and_the_env_take_the_index(built):
    root, corpus, index, *_ = built
    import drmas_envs

    kwargs = {
        "index": str(index),
        "model": str(default_embedder_path()),
        "encoder_name": "e5",
        "cache_dir": str(root / "cache"),
    }
    assert make_retriever("faiss", corpus, **kwargs) is make_retriever("faiss", corpus, **kwargs)
    env = drmas_envs.make(
        "search-orchestrator-v0", retriever="faiss", retriever_kwargs={**kwargs, "corpus": str(corpus)}
    )
    env.reset(seed=1)
    env.step("<verify>no</verify>")
    env.step("<think>t</think><search>Dormonlo Systems</search>")
    assert len(env.infos["search"]["retrieved_ids"]) == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_health(port: int, proc: subprocess.Popen, limit_s: float = 180.0) -> None:
    """Poll GET /health until the server answers (it loads the encoder first), or fail with its stderr."""
    import time

    import httpx

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    pytest.fail(f"the server did not answer /health within {limit_s} s")


@pytest.mark.slow
def test_drmas_retrieval_server_serves_the_index(built, retriever):
    """``drmas retrieval-server --index``: the HTTP retriever (protocol auto-detected) gets the in-process results."""
    pytest.importorskip("fastapi")
    root, corpus, index, *_ = built
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "drmas_train.cli", "retrieval-server", "--index", str(index), "--corpus", str(corpus),
         "--model", str(default_embedder_path()), "--encoder-name", "e5", "--port", str(port),
         "--cache-dir", str(root / "cache"), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_health(port, proc)
        client = HTTPRetriever(f"http://127.0.0.1:{port}/retrieve")
        served, local = client.search(QUERIES[:3], 3), retriever.search(QUERIES[:3], 3)
        assert [[p.id for p in hits] for hits in served] == [[p.id for p in hits] for hits in local]
        assert [p.score for hits in served for p in hits] == pytest.approx(
            [p.score for hits in local for p in hits], abs=1e-5
        )
        assert [[p.contents for p in hits] for hits in served] == [
            [p.contents for p in hits] for hits in local
        ]
        assert client._detected == "drmas"  # the one-query body: the server takes the reference's protocol
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"faiss over 60 passages at http://127.0.0.1:{port}/retrieve" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--retriever", "faiss"], "--retriever faiss needs --index <prebuilt .index file>"),
        (["--index", "x.index"], "--index needs --corpus <the JSONL the index was built from>"),
        (
            ["--index", "x.index", "--corpus", "c.jsonl", "--retriever", "bm25"],
            "--index serves a prebuilt FAISS index",
        ),
        (["--corpus", "missing.jsonl"], "corpus missing.jsonl not found"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(argv, message, capsys, tmp_path, monkeypatch):
    from drmas_train.commands.retrieval_server import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("drmas retrieval-server: ") and message in err and err.count("\n") == 1
