"""The OpenAI-compatible client against a real server on 127.0.0.1 (uvicorn, started here): results,
log-probs, token ids, retries and errors."""

from __future__ import annotations

import concurrent.futures
import threading

import httpx
import pytest

from helpers.backend_fakes import tiny
from helpers.local_server import LocalServer

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from drmas_train.backends.base import SamplingParams  # noqa: E402
from drmas_train.backends.hf import HFBackend  # noqa: E402
from drmas_train.backends.openai import OpenAIBackend, OpenAIServerError  # noqa: E402
from drmas_train.serving.openai_server import create_app  # noqa: E402

PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Name a colour."}]]


@pytest.fixture(scope="module")
def served():
    loaded = tiny("tiny-llama")
    with LocalServer(create_app(HFBackend.from_loaded(loaded), "tiny-llama")) as url:
        yield url, loaded


def test_client_matches_the_local_backend_exactly(served):
    url, loaded = served
    sampling = SamplingParams(temperature=0.9, max_new_tokens=8, n=2, seed=5)
    with OpenAIBackend(url, "tiny-llama", request_token_ids=True, max_concurrency=2) as client:
        remote = client.generate(PROMPTS, sampling)
    local = [g for p in PROMPTS for g in HFBackend.from_loaded(loaded).generate([p], sampling)]
    assert len(remote) == 4
    for r, g in zip(remote, local, strict=True):
        assert (r.text, r.prompt_ids, r.response_ids, r.finish_reason) == (
            g.text,
            g.prompt_ids,
            g.response_ids,
            g.finish_reason,
        )
        assert r.logprobs == pytest.approx(g.logprobs, abs=1e-6)


def test_without_server_token_ids_the_tokenizer_fills_them(served):
    url, loaded = served
    with OpenAIBackend(url, "tiny-llama", tokenizer=loaded.tokenizer) as client:
        (gen,) = client.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=6))
    assert (
        gen.prompt_ids
        == loaded.tokenizer("<|user|>\nWhat is 2 + 3?<|end|>\n<|assistant|>\n", add_special_tokens=False)[
            "input_ids"
        ]
    )
    assert len(gen.logprobs) == 6 and gen.finish_reason in ("stop", "length")
    with OpenAIBackend(url, "tiny-llama") as bare:
        (gen,) = bare.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=3))
    assert gen.prompt_ids == [] and gen.response_ids == [] and len(gen.logprobs) == 3


def test_http_errors_are_reported_without_retry(served):
    url, _ = served
    with OpenAIBackend(url, "other-model", max_retries=3) as client:
        with pytest.raises(OpenAIServerError, match=r"answered HTTP 404: .*model 'other-model' not served"):
            client.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))
    with OpenAIBackend(url, "tiny-llama") as client:
        with pytest.raises(ValueError, match=r"cannot truncate prompts by tokens"):
            client.generate(PROMPTS, SamplingParams(), max_prompt_tokens=10)


def test_retries_on_503_then_succeeds_and_gives_up_after_the_bound():
    calls = {"n": 0}
    app = fastapi.FastAPI()

    @app.post("/v1/chat/completions")
    def flaky(body: dict) -> dict:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise fastapi.HTTPException(503, "busy")
        return {"choices": [{"index": 0, "message": {"content": "fine"}, "finish_reason": "stop"}]}

    @app.post("/down/chat/completions")
    def down(body: dict) -> dict:
        raise fastapi.HTTPException(503, "still busy")

    with LocalServer(app) as url:
        with OpenAIBackend(url, "m", max_retries=2, backoff=0.01) as client:
            (gen,) = client.generate(PROMPTS[:1], SamplingParams())
        assert gen.text == "fine" and gen.logprobs == [] and calls["n"] == 3
        with OpenAIBackend(url.replace("/v1", "/down"), "m", max_retries=1, backoff=0.01) as client:
            with pytest.raises(OpenAIServerError, match=r"answered HTTP 503: .*still busy"):
                client.generate(PROMPTS[:1], SamplingParams())


def test_timeouts_are_bounded():
    """A server whose handler never answers (it waits on an event the test sets only at the end): the call can
    only end through its per-request timeout, once per attempt (2 requests sent: 1 retry). How long it takes is
    measured by ``benchmarks/perf/time_bounds.py``, not asserted."""
    release = threading.Event()
    app = fastapi.FastAPI()

    @app.post("/v1/chat/completions")
    def never(body: dict) -> dict:
        release.wait()
        return {"choices": []}

    sent = []
    with LocalServer(app) as url, OpenAIBackend(url, "m", timeout=0.2, max_retries=1, backoff=0.01) as client:
        client._client.event_hooks["request"].append(sent.append)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        try:
            call = pool.submit(client.generate, PROMPTS[:1], SamplingParams())
            with pytest.raises(httpx.TimeoutException):
                call.result(timeout=120)  # a hang guard, not a measurement: 300x the two 0.2 s attempts
        finally:
            release.set()  # frees the handlers (and a call stuck past the guard) before the server stops
            pool.shutdown()
    assert len(sent) == 2 and all(r.url.path == "/v1/chat/completions" for r in sent)


def test_constructor_validation():
    with pytest.raises(ValueError, match=r"need max_retries >= 0, timeout > 0, max_concurrency >= 1; got -1"):
        OpenAIBackend("http://127.0.0.1:1/v1", "m", max_retries=-1)
