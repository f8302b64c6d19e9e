"""The ``openai`` backend: an OpenAI-compatible ``/v1/chat/completions`` client (vLLM, SGLang, llama.cpp servers,
hosted APIs) for evaluation and for third-party agents.

One HTTP request per conversation (``n`` samples each), sent concurrently (``max_concurrency``), each with a
timeout and bounded retries (tenacity, exponential backoff) on connection errors, timeouts and HTTP 429/5xx;
other HTTP errors fail at once with the server's message.

What comes back depends on the server:

* ``logprobs``: requested (``logprobs: true``) and taken from ``choices[i].logprobs.content[*].logprob`` when
  present; servers compute them under their own convention (vLLM: see :mod:`drmas_train.backends.vllm`), so for
  training prefer the ``hf``/``vllm`` backends. Empty when not returned.
* ``response_ids`` / ``prompt_ids``: the server's ``token_ids`` / ``prompt_token_ids`` when it returns them
  (vLLM's ``return_token_ids`` extension, enabled with ``request_token_ids=True``); otherwise re-encoded with
  ``tokenizer`` when one is given (then their count may differ from the server's log-probs), else empty.

vLLM extensions sent only when used: ``top_k`` (when not -1), ``chat_template_kwargs`` (when given, e.g.
Qwen3's ``enable_thinking``), ``return_token_ids``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from drmas_train.backends.base import Generation, Messages, SamplingParams, render_chat

__all__ = ["OpenAIBackend", "OpenAIServerError", "RETRY_STATUS"]

#: HTTP statuses worth retrying (rate limit, server overload/errors).
RETRY_STATUS = (429, 500, 502, 503, 504)


class OpenAIServerError(RuntimeError):
    """The server answered with a non-retryable HTTP error (or a retryable one after all retries)."""

    def __init__(self, status: int, body: str, url: str) -> None:
        super().__init__(f"{url} answered HTTP {status}: {body[:500]}")
        self.status = status


def _retryable(err: BaseException) -> bool:
    return isinstance(err, httpx.TransportError) or (
        isinstance(err, OpenAIServerError) and err.status in RETRY_STATUS
    )


class OpenAIBackend:
    """Chat completions over HTTP.

    Args:
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``.
        model: the served model name.
        api_key: bearer token (default: ``$OPENAI_API_KEY``; none sent when empty).
        tokenizer: optional transformers tokenizer to re-encode texts when the server returns no token ids.
        timeout: seconds per request (connect + read).
        max_retries: retries after the first attempt (>= 0), on transport errors and HTTP 429/5xx.
        backoff: base of the exponential wait between retries, in seconds (capped at 30 s).
        max_concurrency: simultaneous requests.
        chat_template_kwargs: sent as ``chat_template_kwargs`` (vLLM/SGLang) when non-empty.
        request_token_ids: ask for ``return_token_ids`` (vLLM >= 0.10).
        extra_body: more JSON fields merged into every request.

    Raises:
        ValueError: ``max_retries < 0``, ``timeout <= 0`` or ``max_concurrency < 1``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        tokenizer: Any = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_concurrency: int = 8,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        request_token_ids: bool = False,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if max_retries < 0 or timeout <= 0 or max_concurrency < 1:
            raise ValueError(
                f"need max_retries >= 0, timeout > 0, max_concurrency >= 1; got {max_retries}, {timeout}, {max_concurrency}"
            )
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.request_token_ids = request_token_ids
        self.extra_body = dict(extra_body or {})
        self.max_concurrency = max_concurrency
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)
        self._post = retry(
            retry=retry_if_exception(_retryable),
            stop=stop_after_attempt(max_retries + 1),
            wait=wait_exponential(multiplier=backoff, max=30),
            reraise=True,
        )(self._post_once)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _post_once(self, body: dict[str, Any]) -> dict[str, Any]:
        response = self._client.post(self.url, json=body)
        if response.status_code != 200:
            raise OpenAIServerError(response.status_code, response.text, self.url)
        return response.json()

    def _body(self, messages: Messages, sampling: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "n": sampling.n,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
            "logprobs": True,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.top_k != -1:
            body["top_k"] = sampling.top_k
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        if self.request_token_ids:
            body["return_token_ids"] = True
        body.update(self.extra_body)
        return body

    def _parse(self, messages: Messages, data: dict[str, Any]) -> list[Generation]:
        prompt_ids = data.get("prompt_token_ids")
        if prompt_ids is None:
            prompt_ids = (
                render_chat(self.tokenizer, messages, self.chat_template_kwargs) if self.tokenizer else []
            )
        out = []
        for choice in sorted(data.get("choices", []), key=lambda c: c.get("index", 0)):
            text = (choice.get("message") or {}).get("content") or ""
            content = (choice.get("logprobs") or {}).get("content") or []
            logprobs = [float(c["logprob"]) for c in content]
            response_ids = choice.get("token_ids")
            if response_ids is None:
                response_ids = (
                    self.tokenizer(text, add_special_tokens=False)["input_ids"] if self.tokenizer else []
                )
            out.append(
                Generation(
                    text=text,
                    prompt_ids=list(prompt_ids),
                    response_ids=list(response_ids),
                    logprobs=logprobs,
                    finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
                )
            )
        return out

    def generate(
        self, prompts: Sequence[Messages], sampling: SamplingParams, **kwargs: Any
    ) -> list[Generation]:
        """Sample ``sampling.n`` responses per conversation; ``len(prompts) * n`` results, prompt-major.

        Raises:
            ValueError: prompt truncation requested (``max_prompt_tokens``): the server applies the template, so
                truncate the messages instead.
            OpenAIServerError: an HTTP error (after retries for 429/5xx); httpx errors after retries.
        """
        if kwargs.get("max_prompt_tokens") is not None:
            raise ValueError("the openai backend cannot truncate prompts by tokens (the server renders them)")
        unknown = set(kwargs) - {"max_prompt_tokens", "truncation"}
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)}")
        bodies = [self._body(m, sampling) for m in prompts]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, max(1, len(bodies)))) as pool:
            results = list(pool.map(self._post, bodies))
        out: list[Generation] = []
        for messages, data in zip(prompts, results, strict=True):
            gens = self._parse(messages, data)
            if len(gens) != sampling.n:
                raise OpenAIServerError(200, f"expected {sampling.n} choices, got {len(gens)}", self.url)
            out.extend(gens)
        return out
