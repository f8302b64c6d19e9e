"""The OpenAI-compatible server read with the real ``openai`` client: SSE streaming, content parts,
``/v1/completions``, and batching of concurrent requests (fewer backend calls; the wall time this saves is
measured by ``benchmarks/perf/openai_server.py``)."""

from __future__ import annotations

import threading

import pytest

from helpers.backend_fakes import tiny
from helpers.local_server import LocalServer

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from drmas_train.backends.base import SamplingParams  # noqa: E402
from drmas_train.backends.hf import HFBackend  # noqa: E402
from drmas_train.serving.openai_server import RequestBatcher, create_app  # noqa: E402

MODEL = "tiny-llama"
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def served():
    loaded = tiny(MODEL)
    app = create_app(HFBackend.from_loaded(loaded), MODEL, batch_window_s=0.05)
    with LocalServer(app) as url:
        yield openai.OpenAI(base_url=url, api_key="none", max_retries=0), app, loaded


def test_streaming_chat_equals_the_non_streamed_reply(served):
    client, _, loaded = served
    kw = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 0.9, "seed": 5}
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    (local,) = HFBackend.from_loaded(loaded).generate([MESSAGES], SamplingParams(temperature=0.9, max_new_tokens=12, seed=5))
    assert text == whole.choices[0].message.content == local.text and text
    assert len(content_chunks) > 1  # token by token, not one blob at the end
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason] == [local.finish_reason]
    assert chunks[-1].usage.completion_tokens == len(local.response_ids) == whole.usage.completion_tokens


def test_content_given_as_a_list_of_parts(served):
    client, _, _ = served
    kw = {"model": MODEL, "max_tokens": 8, "temperature": 0.9, "seed": 11}
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is 2"}, {"type": "text", "text": " + 3?"}]}]
    assert (client.chat.completions.create(messages=parts, **kw).choices[0].message.content
            == client.chat.completions.create(messages=MESSAGES, **kw).choices[0].message.content)  # fmt: skip
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    with pytest.raises(openai.BadRequestError, match="content part of type 'image_url' is not supported"):
        client.chat.completions.create(messages=image, **kw)


def test_completions_endpoint_plain_and_streamed(served):
    client, _, loaded = served
    backend = HFBackend.from_loaded(loaded)
    ids = loaded.tokenizer("The answer is", add_special_tokens=False)["input_ids"]
    (local,) = backend.generate_ids([ids], SamplingParams(temperature=0.8, max_new_tokens=10, seed=7))
    kw = {"model": MODEL, "prompt": "The answer is", "max_tokens": 10, "temperature": 0.8, "seed": 7}
    out = client.completions.create(**kw, logprobs=1)
    assert out.object == "text_completion" and out.choices[0].text == local.text
    assert out.choices[0].logprobs.token_logprobs == pytest.approx(local.logprobs, abs=1e-6)
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)
    assert streamed == local.text
    many = client.completions.create(model=MODEL, prompt=["one", "two three"], max_tokens=3, n=2)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]


def test_concurrent_requests_share_batched_generate_calls(served, monkeypatch):
    """Serial requests make one backend call each; 8 concurrent ones share at most 2. The first batch's call is
    held until all 8 requests have reached the batcher (an event, not a timing window), so the other 7 are
    queued by then and the next call takes them together. The wall-time gain this brings is measured by
    ``benchmarks/perf/openai_server.py``, not asserted."""
    client, app, _ = served
    batcher: RequestBatcher = app.state.batcher
    # unseeded: may be merged into one call
    kw = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 1.0}

    calls0 = batcher.backend_calls
    for _ in range(8):
        client.chat.completions.create(**kw)
    assert batcher.backend_calls - calls0 == 8

    submitted, all_in, lock = [0], threading.Event(), threading.Lock()
    # the server tokenizes each chat itself (to check it against the context), so the batch goes to generate_ids
    real_submit, real_generate, batch_sizes = batcher.submit, batcher.backend.generate_ids, []

    def counting_submit(*args, **kwargs):
        future = real_submit(*args, **kwargs)
        with lock:
            submitted[0] += 1
            if submitted[0] == 8:
                all_in.set()
        return future

    def held_generate(prompts, sampling, **kwargs):
        assert all_in.wait(120), "the 8 concurrent requests never reached the batcher"  # a hang guard only
        batch_sizes.append(len(prompts))
        return real_generate(prompts, sampling, **kwargs)

    monkeypatch.setattr(batcher, "submit", counting_submit)
    monkeypatch.setattr(batcher.backend, "generate_ids", held_generate)
    calls0, replies = batcher.backend_calls, []

    def ask() -> None:
        replies.append(client.chat.completions.create(**kw))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(replies) == 8 and all(r.choices[0].message.content is not None for r in replies)
    assert sum(batch_sizes) == 8 and len(batch_sizes) <= 2
    assert batcher.backend_calls - calls0 == len(batch_sizes)


def test_seeded_requests_are_never_merged():
    class Recorder:
        tokenizer = None

        def __init__(self):
            self.batches = []

        def generate(self, prompts, sampling):
            self.batches.append(len(prompts))
            return [None] * len(prompts) * sampling.n

    rec = Recorder()
    # all 6 requests fall into one collection by count, not by racing a short window: it closes at 6 prompts
    batcher = RequestBatcher(rec, batch_window_s=300, max_batch_prompts=6)
    try:
        futures = [batcher.submit("chat", [MESSAGES], SamplingParams(seed=s)) for s in (1, 1, 2)]
        futures += [batcher.submit("chat", [MESSAGES], SamplingParams()) for _ in range(3)]
        for f in futures:
            assert f.result(timeout=120) == [None]  # a hang guard only
    finally:
        batcher.close()
    assert sorted(rec.batches) == [1, 1, 1, 3]
    with pytest.raises(ValueError, match="batch_window_s must be >= 0 seconds"):
        RequestBatcher(rec, batch_window_s=-1)


def test_llm_policy_from_model_with_each_backend_kind(served):
    from drmas_train.eval.policies import LLMPolicy

    client, _, _ = served
    local = LLMPolicy.from_model(MODEL, max_new_tokens=8, temperature=0.9, seed=5)
    remote = LLMPolicy.from_model(MODEL, backend="openai", base_url=str(client.base_url), max_new_tokens=8,
                                  temperature=0.9, seed=5)  # fmt: skip
    assert remote(MESSAGES) == local(MESSAGES) and local(MESSAGES)
    with pytest.raises(ValueError, match=r"backend must be one of 'hf', 'vllm', 'openai', got 'tgi'"):
        LLMPolicy.from_model(MODEL, backend="tgi")
    with pytest.raises(ValueError, match=r"backend='openai' needs base_url"):
        LLMPolicy.from_model(MODEL, backend="openai")
    with pytest.raises(ValueError, match=r"base_url is only for backend='openai', got backend='hf'"):
        LLMPolicy.from_model(MODEL, base_url="http://127.0.0.1:1/v1")
