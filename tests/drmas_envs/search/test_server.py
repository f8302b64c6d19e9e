import socket

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from drmas_envs.search.corpus import Passage  # noqa: E402
from drmas_envs.search.retrievers import RetrieverError, RetrieverUnavailableError, make_retriever  # noqa: E402
from drmas_envs.search.retrievers.http import HTTPRetriever  # noqa: E402
from drmas_envs.search.server import ServerThread  # noqa: E402
from drmas_envs.search.synthetic import EncyclopediaConfig, generate_encyclopedia  # noqa: E402
from drmas_envs.search.testing import ReferenceProtocolServer  # noqa: E402


@pytest.fixture(scope="module")
def local():
    return make_retriever("bm25", generate_encyclopedia(EncyclopediaConfig()).passages)


@pytest.fixture(scope="module")
def server(local):
    # waits on uvicorn's ``started`` flag; 300 s is roomy under any load (start-up takes well under a second)
    with ServerThread(local, start_timeout=300) as srv:
        yield srv


@pytest.mark.slow
def test_http_equals_in_process(server, local):
    enc = generate_encyclopedia(EncyclopediaConfig())
    queries = [t.question for t in list(enc.tasks)[:40]] + ["", "zzzz unknown"]
    client = HTTPRetriever(server.url, timeout=10)
    assert server.host == "127.0.0.1" and server.port > 0
    for topk in (1, 3, 7):
        assert client.search(queries, topk) == local.search(queries, topk)
    client.close()
    client.close()


def test_wire_format_is_search_r1(server):
    reply = httpx.post(server.url, json={"queries": ["Dormonlo Systems"], "topk": 2, "return_scores": True}).json()
    (hits,) = reply["result"]
    assert len(hits) == 2 and set(hits[0]) == {"document", "score"} and set(hits[0]["document"]) == {"id", "contents"}
    assert hits[0]["document"]["contents"].startswith('"')
    plain = httpx.post(server.url, json={"queries": ["Dormonlo Systems"]}).json()  # default topk 3, no scores
    assert len(plain["result"][0]) == 3 and set(plain["result"][0][0]) == {"id", "contents"}
    parsed = HTTPRetriever(server.url)._parse(plain, 1)
    assert parsed[0][0].title == "Dormonlo Systems" and parsed[0][0].score == 0.0
    health = httpx.get(server.url.replace("/retrieve", "/health")).json()
    assert health == {"status": "ok", "retriever": "bm25", "num_passages": 450}


def test_bad_request_is_a_clear_error(server):
    # topk above the server's max_topk: both bodies rejected, one error that says so (no retry, no traceback of 422s)
    with pytest.raises(RetrieverError, match=r"rejected both request bodies, \{'query': str\}.*HTTP 422.*"
                                             r"\{'queries': \[str, \.\.\.\]\}.*HTTP 422"):  # fmt: skip
        HTTPRetriever(server.url).search(["q"], 5000)
    with pytest.raises(RetrieverError, match=r"rejected the request body of protocol='search_r1'.*HTTP 422.*"
                                             r"Set retriever_kwargs.protocol: auto"):  # fmt: skip
        HTTPRetriever(server.url, protocol="search_r1").search(["q"], 5000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_down_clear_error_after_all_attempts():
    """Connections refused: the error names the cause and how to start a server after exactly ``max_retries + 1``
    attempts. The port is held by a bound socket that never listens (Linux refuses connections to it), so no other
    process can take it meanwhile; the 60 s budget is far beyond the 4 attempts' backoff (0.05 + 0.1 + 0.2 s), so
    the retry bound, not the clock, ends the call."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/retrieve"
        client = HTTPRetriever(url, timeout=60, max_retries=3, backoff=0.05)
        with pytest.raises(RetrieverUnavailableError,
                           match=r"is unavailable: ConnectError.*4 attempt\(s\).*drmas retrieval-server"):  # fmt: skip
            client.search(["anything"], 3)


class _SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never answers; counts every connection ever made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.conns: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/retrieve"

    def connections(self) -> int:
        """Every connection made so far: the kernel completes them before ``accept``, so drain the backlog."""
        self.sock.setblocking(False)
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except BlockingIOError:
                return len(self.conns)

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


def test_hanging_server_times_out_once_for_the_whole_call():
    """A server that never answers: with no deadline the call would block forever, and with only per-attempt
    timeouts it would make 6 attempts (6 connections). The whole-call deadline, retries included, ends it after
    the one connection whose reply never comes: retries are not even tried once the budget is spent.
    How close to the 1 s budget it returns is measured by ``benchmarks/perf/time_bounds.py``."""
    server = _SilentServer()
    try:
        client = HTTPRetriever(server.url, timeout=1.0, max_retries=5, total_timeout=1.0)
        with pytest.raises(RetrieverUnavailableError, match=r"(ReadTimeout|TimeoutException): .*1 s in all"):
            client.search(["q"], 3)
        # one connection (none only if the machine froze for the whole 1 s before the first request was sent)
        assert server.connections() <= 1
    finally:
        server.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"url": "127.0.0.1:8000"}, "url must be an http"),
        ({"timeout": 0}, "timeout must be > 0 seconds, got 0"),
        ({"max_retries": -1}, "max_retries must be an int >= 0, got -1"),
        ({"backoff": -1}, "backoff must be >= 0 seconds, got -1"),
        ({"total_timeout": 0}, "total_timeout must be > 0 seconds or None, got 0"),
        ({"url": []}, "or a non-empty list of them, got"),
        ({"url": ["http://a/retrieve", "b"]}, "or a non-empty list of them, got"),
        ({"protocol": "grpc"}, r"protocol must be one of \('auto', 'drmas', 'search_r1'\), got 'grpc'"),
    ],
)
def test_bad_client_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HTTPRetriever(**kwargs)


def test_env_over_http_matches_in_process(server):
    import drmas_envs

    http_env = drmas_envs.make("search-orchestrator-v0", retriever="http", retriever_kwargs={"url": server.url})
    local_env = drmas_envs.make("search-orchestrator-v0")
    for env in (http_env, local_env):
        env.reset(seed=5)
        env.step("<verify>no</verify>")
        env.step(f"<search>{env.unwrapped.task.question}</search>")
    assert http_env.observe("verifier") == local_env.observe("verifier")


def test_cli_parser():
    from drmas_train.commands.retrieval_server import _parser

    args = _parser().parse_args(["--corpus", "wiki.jsonl", "--retriever", "dense", "--port", "9001"])
    assert (args.corpus, args.retriever, args.port, args.host, args.topk) == ("wiki.jsonl", "dense", 9001, "127.0.0.1", 3)
    with pytest.raises(SystemExit):
        _parser().parse_args(["--retriever", "http"])


def test_passage_equality_survives_json():
    p = Passage("a", "T", "x", 0.1 + 0.2)
    client = HTTPRetriever("http://127.0.0.1:1/retrieve")
    assert client._parse({"result": [[{"document": p.to_document(), "score": p.score}]]}, 1) == [[p]]
    with pytest.raises(RetrieverError, match="broke the protocol"):
        client._parse({"results": []}, 1)


@pytest.mark.slow
def test_cli_serves_a_corpus_file(tmp_path):
    """``drmas retrieval-server`` in its own process: real socket on 127.0.0.1, same results as in-process."""
    import subprocess
    import sys

    from drmas_envs.search.corpus import save_corpus_jsonl

    passages = generate_encyclopedia(EncyclopediaConfig()).passages
    corpus = save_corpus_jsonl(passages, tmp_path / "wiki.jsonl")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "drmas_train.cli", "retrieval-server", "--corpus", str(corpus), "--port", str(port),
         "--cache-dir", str(tmp_path / "cache"), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        # the index is built once this line comes: blocks until then, or "" if the process died first
        ready = proc.stdout.readline()
        if not ready:
            pytest.fail(f"drmas retrieval-server exited before serving: {proc.stderr.read()[-2000:]}")
        assert f"bm25 over 450 passages at http://127.0.0.1:{port}/retrieve" in ready
        # then uvicorn binds the port (well under a second): retried until it answers, within a roomy 5 minutes
        url = f"http://127.0.0.1:{port}/retrieve"
        client = HTTPRetriever(url, timeout=300, max_retries=100_000, backoff=0.05)
        queries = ["Dormonlo Systems", "founder of a robotics company"]
        assert client.search(queries, 3) == make_retriever("bm25", passages).search(queries, 3)
    finally:
        proc.terminate()
        proc.communicate(timeout=300)


# ---- compatibility with the Search-R1 and Dr. MAS clients and servers (issue 16, item 6) ----


def _reference_passages2string(retrieval_result):
    """The Dr. MAS search tool's rendering of one reply list (langfengQ/DrMAS .../skyrl_gym/tools/search.py:132-137)."""
    return "".join(f"Doc {i + 1}: {doc['document']['contents'].strip()}\n" for i, doc in enumerate(retrieval_result))


def test_server_answers_the_search_r1_client_body_unchanged(server, local):
    """PeterGriffinJin/Search-R1 search_r1/llm_agent/generation.py ``_batch_search``: a batch, scores on."""
    body = {"queries": ["Dormonlo Systems", "zzzz unknown"], "topk": 3, "return_scores": True}
    reply = httpx.post(server.url, json=body).json()
    assert [[hit["document"]["id"] for hit in hits] for hits in reply["result"]] == [
        [p.id for p in hits] for hits in local.search(body["queries"], 3)
    ]
    # Search-R1's _passages2string reads document["contents"] and splits the title off its first line
    assert reply["result"][0][0]["document"]["contents"].split("\n")[0] == '"Dormonlo Systems"'


def test_server_answers_the_drmas_reference_client_body_unchanged(server, local):
    """langfengQ/DrMAS .../skyrl_gym/tools/search.py:48: ``{"query": str, "topk", "return_scores": True}``; the tool
    reads ``result`` as one list per query of ``{"document": {"contents"}, "score"}`` (:222-227)."""
    reply = httpx.post(server.url, json={"query": "Dormonlo Systems", "topk": 2, "return_scores": True}).json()
    (hits,) = reply["result"]
    expected = local.search(["Dormonlo Systems"], 2)[0]
    assert [h["document"]["id"] for h in hits] == [p.id for p in expected]
    assert [h["score"] for h in hits] == pytest.approx([p.score for p in expected])
    assert _reference_passages2string(hits) == "".join(f"Doc {i}: {p.contents}\n" for i, p in enumerate(expected, 1))
    plain = httpx.post(server.url, json={"query": "Dormonlo Systems"}).json()  # the reference server's defaults
    assert len(plain["result"]) == 1 and len(plain["result"][0]) == 3 and set(plain["result"][0][0]) == {"id", "contents"}


@pytest.mark.parametrize(
    "body",
    [{"topk": 3}, {"query": "a", "queries": ["a"]}, {"query": ["a"]}],
    ids=["neither", "both", "query-not-a-str"],
)
def test_server_rejects_ambiguous_bodies(server, body):
    resp = httpx.post(server.url, json=body)
    assert resp.status_code == 422
    if "topk" in body or "queries" in body:
        assert "give exactly one of 'queries'" in resp.text


@pytest.fixture(scope="module")
def reference_server(local):
    """The Dr. MAS reference server's HTTP interface (retrieval_server.py:304-345) over our BM25 index."""
    with ReferenceProtocolServer(local, start_timeout=300) as srv:
        yield srv


def test_reference_stand_in_rejects_a_batch_as_the_reference_does(reference_server):
    resp = httpx.post(reference_server.url, json={"queries": ["a"], "topk": 3})
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "query"]
    plain = httpx.post(reference_server.url, json={"query": "Dormonlo Systems", "topk": 0}).json()  # 0: default 3
    assert len(plain["result"]) == 1 and len(plain["result"][0]) == 3 and set(plain["result"][0][0]) == {"id", "contents"}


def test_http_retriever_detects_the_reference_protocol(reference_server, local):
    """protocol="auto" (default): no 422 reaches the caller; every search is one {"query"} request."""
    queries = ["Dormonlo Systems", "zzzz unknown", "capital"]
    before = len(reference_server.requests)
    client = HTTPRetriever(reference_server.url)
    assert client.search(queries, 3) == local.search(queries, 3)
    assert reference_server.requests[before:] == [{"query": q, "topk": 3, "return_scores": True} for q in queries]
    assert client.search(queries[:1], 2) == local.search(queries[:1], 2) and client._detected == "drmas"
    assert HTTPRetriever(reference_server.url, protocol="drmas").search(queries, 3) == local.search(queries, 3)


def test_http_retriever_detects_a_batch_server(local):
    """A Search-R1-style server ({"queries"} required) answers 422 to the first body: auto switches to a batch."""
    import fastapi
    from pydantic import BaseModel

    class BatchRequest(BaseModel):  # Search-R1 search_r1/search/retrieval_server.py QueryRequest
        queries: list[str]
        topk: int | None = None
        return_scores: bool = False

    app = fastapi.FastAPI()

    @app.post("/retrieve")
    def retrieve(request: BatchRequest):
        hits = local.search(request.queries, request.topk or 3)
        return {"result": [[{"document": p.to_document(), "score": p.score} for p in h] for h in hits]}

    with ServerThread(app=app, start_timeout=300) as srv:
        client = HTTPRetriever(srv.url)
        assert client.search(["Dormonlo Systems", "capital"], 3) == local.search(["Dormonlo Systems", "capital"], 3)
        assert client._detected == "search_r1"
        with pytest.raises(RetrieverError, match=r"does not take the body protocol='drmas' sends \(\{'query': str\} "
                                                 r".*it wants \{'queries': \[str, \.\.\.\]\} \(a batch\), the body of "
                                                 r"Search-R1's retrieval server\. Set retriever_kwargs.protocol: "
                                                 r"search_r1 \(or auto\)"):  # fmt: skip
            HTTPRetriever(srv.url, protocol="drmas").search(["q"], 3)


def test_wrong_protocol_is_one_clear_error(reference_server):
    with pytest.raises(RetrieverError, match=r"does not take the body protocol='search_r1' sends .* it wants "
                                             r"\{'query': str\} \(one query per request\), the body of the Dr\. MAS "
                                             r"reference server .*Set retriever_kwargs.protocol: drmas \(or auto\)"):  # fmt: skip
        HTTPRetriever(reference_server.url, protocol="search_r1").search(["Dormonlo Systems"], 3)


def test_round_robin_over_urls(local):
    """A list of URLs (the reference's search_url list): requests alternate; a retry moves to the next URL."""
    with ReferenceProtocolServer(local, start_timeout=300) as a, ReferenceProtocolServer(local, start_timeout=300) as b:
        client = HTTPRetriever([a.url, b.url])
        for q in ["Dormonlo Systems", "capital", "founder", "robotics"]:
            assert client.search([q], 3) == local.search([q], 3)
        assert (len(a.requests), len(b.requests)) == (2, 2)
        assert [r["query"] for r in a.requests] == ["Dormonlo Systems", "founder"]
        down = f"http://127.0.0.1:{_free_port()}/retrieve"
        failover = HTTPRetriever([down, a.url], backoff=0)
        assert [failover.search([q], 3) for q in ("capital", "founder")] == [local.search([q], 3) for q in ("capital", "founder")]
        assert [r["query"] for r in a.requests[2:]] == ["capital", "founder"]
        assert "http" in repr(failover) and str([down, a.url]) in repr(failover)


def test_retrieval_budget_is_the_reference_s():
    """ppo_trainer.yaml:329 (timeout 60) and tools/search.py:16,77 (10 attempts, waits 1, 2, ... s)."""
    client = HTTPRetriever()
    assert (client.timeout, client.max_retries, client.backoff, client.total_timeout) == (60.0, 9, 1.0, None)
    assert client.protocol == "auto" and client.urls == ("http://127.0.0.1:8000/retrieve",)


def test_env_over_the_drmas_reference_server(reference_server):
    import drmas_envs

    env = drmas_envs.make("search-orchestrator-v0", retriever="http", retriever_kwargs={"url": reference_server.url})
    env.reset(seed=5)
    env.step("<verify>no</verify>")
    env.step(f"<think>t</think><search>{env.unwrapped.task.question}</search>")
    assert env.infos["search"]["retrieved_ids"] and "<information>{\"result\": \"Doc 1: " in env.observe("verifier")["prompt"]
