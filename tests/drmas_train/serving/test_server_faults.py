"""``drmas serve`` survives faults and bad input (issue 40): prompts over the context and ``max_tokens`` checked
before any compute, OpenAI-shaped 400/404/413 errors that never echo a large input, bounded bodies, a client that
disconnects has its generation stopped, one bad or withdrawn request does not fail the others of its batch, and
SIGTERM stops the server with a request in flight. The load version of these faults is
``benchmarks/serving/faults.py``."""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
import time

import pytest

from drmas_train.backends.base import Generation, SamplingParams
from helpers.backend_fakes import tiny
from helpers.local_server import LocalServer

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from drmas_train.backends.hf import HFBackend  # noqa: E402
from drmas_train.serving.openai_server import RequestBatcher, create_app  # noqa: E402

MODEL = "tiny-qwen3"
CONTEXT = 64  # a small context so that "too long" is a short prompt


@pytest.fixture(scope="module")
def served():
    loaded = tiny(MODEL)
    app = create_app(HFBackend.from_loaded(loaded), MODEL, context_tokens=CONTEXT, max_body_bytes=20_000)
    with LocalServer(app) as url:
        yield url, app, loaded


def _chat(url, **body):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(f"{url}/chat/completions", json=body, timeout=120)


def _error(resp, status):
    """The OpenAI-shaped error of ``resp`` after checking its status and keys."""
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    return err


def _prompt_tokens(loaded, text):
    return len(HFBackend.from_loaded(loaded).encode_prompts([[{"role": "user", "content": text}]])[0])


def test_a_prompt_over_the_context_is_refused_before_any_compute(served):
    url, app, loaded = served
    calls = app.state.batcher.backend_calls
    text = "word " * 200
    n = _prompt_tokens(loaded, text)
    err = _error(_chat(url, messages=[{"role": "user", "content": text}]), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert err["message"] == (f"This model's maximum context length is {CONTEXT} tokens, but the prompt has {n} tokens "
                              f"(at most {CONTEXT - 1}, to leave room for one generated token); shorten it, or start "
                              "the server with --prompt-truncation left")  # fmt: skip
    assert app.state.batcher.backend_calls == calls  # refused before the batcher saw it
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=re.escape(f"maximum context length is {CONTEXT} tokens")):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}])


def test_max_tokens_is_validated_and_bounded_by_the_context(served):
    url, _, loaded = served
    n = _prompt_tokens(loaded, "hi")
    for field in ("max_tokens", "max_completion_tokens"):
        err = _error(_chat(url, **{field: 0}), 400)  # 0 is an error, not "unset"
        assert err["param"] == field and err["message"] == f"{field}: Input should be greater than or equal to 1"
    err = _error(_chat(url, max_tokens=10**9), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert err["message"] == (f"This model's maximum context length is {CONTEXT} tokens, but {n + 10**9} were "
                              f"requested ({n} in the prompt, {10**9} in the completion); set max_tokens to at most "
                              f"{CONTEXT - n}")  # fmt: skip
    ok = _chat(url, max_tokens=CONTEXT - n, temperature=0)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= CONTEXT - n
    unset = _chat(url, temperature=0).json()  # unset: whatever room the context leaves, not 256
    assert unset["usage"]["completion_tokens"] <= CONTEXT - n and unset["usage"]["prompt_tokens"] == n


def test_left_truncation_keeps_the_last_tokens_that_fit(served):
    _, _, loaded = served
    app = create_app(HFBackend.from_loaded(loaded), MODEL, context_tokens=CONTEXT, prompt_truncation="left")
    with LocalServer(app) as url:
        reply = _chat(url, messages=[{"role": "user", "content": "word " * 200}], max_tokens=4, temperature=0).json()
    assert reply["usage"]["prompt_tokens"] == CONTEXT - 4
    with pytest.raises(ValueError, match=re.escape("prompt_truncation must be one of ('error', 'left'), got 'right'")):
        create_app(HFBackend.from_loaded(loaded), MODEL, prompt_truncation="right")


@pytest.mark.parametrize(
    ("raw", "param", "message"),
    [
        ('{"model": "tiny-qwen3", "messages": [{"role": "wizard", "content": "hi"}]}', "messages.0.role",
         "messages.0.role: Input should be 'system', 'developer', 'user', 'assistant', 'tool' or 'function'"),
        ('{"model": "tiny-qwen3", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e9}',
         "temperature", "temperature: Input should be less than or equal to 2"),
        ('{"model": "tiny-qwen3", "messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
         "temperature", "temperature: Input should be a finite number"),
        ('{"model": "tiny-qwen3", "messages": [{"role": "user", "content": "hi"}], "top_p": NaN}',
         "top_p", "top_p: Input should be a finite number"),
        ('{"model": "tiny-qwen3", "messages": [{"role": "user", "content": "hi"}], "n": 0}',
         "n", "n: Input should be greater than or equal to 1"),
        ('{"model": "tiny-qwen3"}', "messages", "messages: Field required"),
        ('{"model": "tiny-qwen3", "messages": [', "body", "body: JSON decode error (Expecting value at character 37)"),
    ],
    ids=["unknown-role", "temperature-1e9", "temperature-inf", "top-p-nan", "n-0", "no-messages", "bad-json"],
)  # fmt: skip
def test_bad_requests_get_openai_shaped_400s(served, raw, param, message):
    url, _, _ = served
    resp = httpx.post(f"{url}/chat/completions", content=raw, headers={"content-type": "application/json"})
    err = _error(resp, 400)
    assert err["param"] == param and err["message"] == message and err["code"] is None


def test_bodies_are_bounded_and_errors_never_echo_a_large_input(served):
    url, _, _ = served
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 30_000}]}
    err = _error(httpx.post(f"{url}/chat/completions", json=big), 413)
    assert err["message"].startswith("request body of ") and "over this server's limit of 20000 bytes" in err["message"]

    def chunks():  # no Content-Length: the limit applies to the bytes read
        yield json.dumps(big).encode()

    resp = httpx.post(f"{url}/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert _error(resp, 413)["message"] == ("request body of more than 20000 bytes is over this server's limit of "
                                            "20000 bytes (--max-body-bytes)")  # fmt: skip
    resp = _chat(url, model="m" * 15_000)
    err = _error(resp, 404)
    assert err["code"] == "model_not_found" and len(resp.content) < 1000
    resp = _chat(url, messages=[{"role": "user", "content": [{"type": "image" * 2000}]}])
    assert _error(resp, 400)["param"] == "messages" and len(resp.content) < 1000


# ---- disconnects, aborts and bad neighbours: a backend whose decode loop is slow and observable ----


class SlowBackend:
    """Decodes one token per ``step_s`` until ``max_new_tokens`` or until ``on_tokens`` stops the row, as the hf
    backend does; records every call's rows and finish reasons. A prompt whose text holds "bad" raises."""

    tokenizer = None

    def __init__(self, step_s=0.01):
        self.step_s, self.calls, self.steps, self.done = step_s, [], 0, threading.Event()

    def generate(self, prompts, sampling: SamplingParams, *, on_tokens=None):
        if any("bad" in m["content"] for p in prompts for m in p):
            raise ValueError("this prompt is bad")
        rows = len(prompts) * sampling.n
        counts, reasons, live = [0] * rows, ["length"] * rows, list(range(rows))
        for _ in range(sampling.max_new_tokens):
            time.sleep(self.step_s)
            self.steps += 1
            stopped = set(on_tokens(live, [7] * len(live)) or ()) if on_tokens else set()
            for r in live:
                counts[r] += 1
                if r in stopped:
                    reasons[r] = "abort"
            live = [r for r in live if r not in stopped]
            if not live:
                break
        self.calls.append(reasons)
        self.done.set()
        return [Generation("x" * c, [1], [7] * c, [0.0] * c, reasons[r]) for r, c in enumerate(counts)]


def test_a_disconnected_client_has_its_generation_stopped():
    backend = SlowBackend()
    app = create_app(backend, "slow", disconnect_poll_s=0.05)
    with LocalServer(app) as url:
        body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000}
        with pytest.raises(httpx.ReadTimeout):  # the client gives up
            httpx.post(f"{url}/chat/completions", json=body, timeout=0.5)
        assert backend.done.wait(60), "the abandoned generation never stopped"  # a hang guard only
        assert backend.calls == [["abort"]] and backend.steps < 100_000
        backend.done.clear()
        steps = backend.steps
        with httpx.stream("POST", f"{url}/chat/completions", json={**body, "stream": True}, timeout=60) as resp:
            assert resp.status_code == 200
            while backend.steps == steps:  # generating: then the client drops the stream without reading it
                time.sleep(0.01)
        assert backend.done.wait(60), "the dropped stream's generation never stopped"
        assert backend.calls[-1] == ["abort"]
        ok = httpx.post(f"{url}/chat/completions", json={**body, "max_tokens": 3}, timeout=60).json()
        assert ok["choices"][0]["finish_reason"] == "length" and ok["usage"]["completion_tokens"] == 3


def test_a_bad_or_withdrawn_request_does_not_fail_its_batch():
    backend = SlowBackend(step_s=0.002)
    batcher = RequestBatcher(backend, batch_window_s=300, max_batch_prompts=2)  # both always in one batch
    try:
        sampling = SamplingParams(max_new_tokens=5)
        good = batcher.submit("chat", [[{"role": "user", "content": "good"}]], sampling)
        bad = batcher.submit("chat", [[{"role": "user", "content": "bad"}]], sampling)
        assert [g.finish_reason for g in good.result(timeout=60)] == ["length"]
        with pytest.raises(ValueError, match="this prompt is bad"):
            bad.result(timeout=60)
        assert backend.calls == [["length"]]  # the batch of both failed; each again alone, only the good one ran

        long = SamplingParams(max_new_tokens=100_000)
        kept = batcher.submit("chat", [[{"role": "user", "content": "a"}]], long.replace(max_new_tokens=300))
        dropped = batcher.submit("chat", [[{"role": "user", "content": "b"}]], long.replace(max_new_tokens=300))
        time.sleep(0.05)
        assert dropped.cancel()  # what an asyncio cancellation of the request does
        (gen,) = kept.result(timeout=60)
        assert gen.finish_reason == "length" and len(gen.response_ids) == 300
        assert backend.calls[-1] == ["length", "abort"]
    finally:
        batcher.close()
    with pytest.raises(RuntimeError, match="the server is shutting down"):
        batcher.submit("chat", [[{"role": "user", "content": "late"}]], sampling)


def test_the_hf_backend_drops_the_rows_its_callback_stops():
    """``on_tokens`` returning rows stops them at once (finish_reason "abort"); the others decode on."""
    backend = HFBackend.from_loaded(tiny(MODEL))
    seen = []

    def stop_row_0(rows, tokens):
        seen.append(list(rows))
        return [0] if len(seen) == 3 else None

    gens = backend.generate_ids([[1, 2, 3], [4, 5, 6]], SamplingParams(max_new_tokens=12, seed=0, temperature=0),
                                on_tokens=stop_row_0)  # fmt: skip
    assert gens[0].finish_reason == "abort" and len(gens[0].response_ids) == 3
    assert gens[1].finish_reason != "abort" and all(0 not in rows for rows in seen[3:])


def test_closing_the_batcher_aborts_the_generation_in_progress():
    backend = SlowBackend()
    batcher = RequestBatcher(backend)
    future = batcher.submit("chat", [[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=100_000))
    while backend.steps == 0:
        time.sleep(0.01)
    batcher.close(timeout=60)
    assert backend.calls == [["abort"]]
    with pytest.raises(RuntimeError, match="the server is shutting down"):
        future.result(timeout=1)


@pytest.mark.slow
def test_sigterm_stops_drmas_serve_with_a_request_in_flight(tmp_path):
    """``drmas serve`` in its own process: SIGTERM while a long stream is generating stops it (the graceful
    shutdown's timeout, then the generation is aborted); the exit is waited for with a roomy hang guard."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "drmas_train.cli", "serve", "--model", MODEL, "--port", str(port),
                             "--shutdown-timeout", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                httpx.get(f"{url}/models", timeout=5).raise_for_status()
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8000, "stream": True}
        first = threading.Event()

        def stream():
            try:
                with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=300) as resp:
                    for _ in resp.iter_lines():
                        first.set()
            except httpx.HTTPError:
                pass

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(stream)
            assert first.wait(120), "the stream never started"
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            # uvicorn re-raises the signal it caught once it has shut down: the exit status is SIGTERM's
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), proc.stdout.read()
            took = time.monotonic() - t0
        print(f"stopped {took:.1f} s after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
