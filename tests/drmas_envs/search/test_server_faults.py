"""``drmas retrieval-server`` survives faults (issue 40): an abandoned request stops at its next search call, a full
server answers 503, bodies are bounded, the over-limit error does not echo the request, SIGTERM stops it with a
request in flight. The load version is ``benchmarks/serving/faults.py``."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from drmas_envs.search.corpus import Passage  # noqa: E402
from drmas_envs.search.server import ServerThread, create_app  # noqa: E402


class SlowRetriever:
    """Sleeps ``call_s`` per search call and records each call's number of queries."""

    name = "slow"
    passages = [Passage("0", "", "zero")]

    def __init__(self, call_s=0.05):
        self.call_s, self.calls, self.started = call_s, [], threading.Event()

    def search(self, queries, topk):
        self.started.set()
        time.sleep(self.call_s)
        self.calls.append(len(queries))
        return [[Passage("0", "", q, 1.0)] for q in queries]


def test_an_abandoned_request_stops_at_its_next_search_call():
    slow = SlowRetriever()
    app = create_app(slow, search_chunk=4, disconnect_poll_s=0.02)
    with ServerThread(app=app, start_timeout=300) as srv:
        with pytest.raises(httpx.ReadTimeout):  # 400 queries = 100 calls of 0.05 s: the client gives up at 0.3 s
            httpx.post(srv.url, json={"queries": [f"q{i}" for i in range(400)]}, timeout=0.3)
        time.sleep(1.0)  # long enough for 20 more calls, had it gone on
        done = len(slow.calls)
        assert done < 20, slow.calls
        time.sleep(0.3)
        assert len(slow.calls) == done  # stopped, not slowed down
        reply = httpx.post(srv.url, json={"query": "after", "topk": 1}, timeout=60).json()
        assert reply == {"result": [[Passage("0", "", "after").to_document()]]}


def test_a_full_server_answers_503():
    slow = SlowRetriever(call_s=0.5)
    app = create_app(slow, max_pending=1)
    with ServerThread(app=app, start_timeout=300) as srv:
        first = threading.Thread(target=lambda: httpx.post(srv.url, json={"query": "a"}, timeout=60))
        first.start()
        assert slow.started.wait(60)
        busy = httpx.post(srv.url, json={"query": "b"}, timeout=60)
        first.join()
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert busy.json() == {"detail": "the retrieval server is busy (1 requests in progress); retry later"}


def test_the_query_limit_error_does_not_echo_the_request_and_bodies_are_bounded():
    slow = SlowRetriever(call_s=0)
    with ServerThread(app=create_app(slow, max_body_bytes=200_000), start_timeout=300) as srv:
        queries = ["x" * 30] * 5000  # 175 kB, under the body limit, over max_queries
        resp = httpx.post(srv.url, json={"queries": queries}, timeout=60)
        assert resp.status_code == 422 and len(resp.content) < 1000
        assert resp.json() == {"detail": [{"type": "too_long", "loc": ["body", "queries"],
                                           "msg": "List should have at most 4096 items after validation, not 5000"}]}  # fmt: skip
        resp = httpx.post(srv.url, json={"queries": ["x" * 1000] * 300}, timeout=60)  # 300 kB
        assert resp.status_code == 413 and resp.text == "Content Too Large"
        assert slow.calls == []


@pytest.mark.slow
def test_sigterm_stops_the_retrieval_server_with_a_request_in_flight(tmp_path):
    import os
    import signal
    import socket
    import subprocess
    import sys

    from drmas_envs.search.corpus import save_corpus_jsonl
    from drmas_envs.search.synthetic import EncyclopediaConfig, generate_encyclopedia

    corpus = save_corpus_jsonl(generate_encyclopedia(EncyclopediaConfig()).passages, tmp_path / "wiki.jsonl")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "drmas_train.cli", "retrieval-server", "--corpus", str(corpus),
                             "--port", str(port), "--cache-dir", str(tmp_path / "cache"), "--shutdown-timeout", "1",
                             "--workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    url = f"http://127.0.0.1:{port}/retrieve"
    try:
        assert proc.stdout.readline(), "the server exited before serving"
        deadline = time.monotonic() + 300
        while True:
            try:
                httpx.post(url, json={"query": "x"}, timeout=5).raise_for_status()
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        big = {"queries": [f"founder of company {i} robotics systems" for i in range(4096)], "topk": 50}
        threads = [threading.Thread(target=lambda: _post_quietly(url, big)) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal it caught once it has shut down: the exit status is SIGTERM's
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM), proc.stdout.read()
        print(f"stopped {time.monotonic() - t0:.1f} s after SIGTERM")
        for t in threads:
            t.join(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _post_quietly(url, body):
    try:
        httpx.post(url, json=body, timeout=120)
    except httpx.HTTPError:
        pass
