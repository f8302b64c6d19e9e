"""LLM policies for playing drmas envs without training: ``policy(observation) -> action text``.

Example (five lines)::

    import drmas_envs
    from drmas_train.eval.policies import LLMPolicy

    env = drmas_envs.make("math-solver-verifier-v0", render_mode="human")
    policy = LLMPolicy.from_model("smollm2-135m-instruct", max_new_tokens=256)
    env.reset(seed=0)
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        env.step(None if terminated or truncated else policy(obs))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from drmas_train.backends.base import Backend, Messages, SamplingParams, reports_tokens
from drmas_train.collect.progress import TokenProgress

__all__ = ["LLMPolicy"]


def _messages(observation: Any) -> list[dict[str, str]]:
    """Chat messages from a drmas observation dict, a message list or a plain user string."""
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    if isinstance(observation, Mapping) and "messages" in observation:
        return [dict(m) for m in observation["messages"]]
    if isinstance(observation, Sequence) and all(isinstance(m, Mapping) for m in observation):
        return [dict(m) for m in observation]
    raise TypeError(
        "an observation must be a drmas observation dict with 'messages', a list of chat messages or a str, "
        f"got {type(observation).__name__}"
    )


class LLMPolicy:
    """Wrap a backend as ``policy(observation) -> str`` (the response text, used as the env action).

    Args:
        backend: any :class:`~drmas_train.backends.base.Backend`.
        sampling: sampling parameters (``n`` is forced to 1).
        progress: show a bar of generated tokens during each call (backends that report tokens as they decode;
            :class:`~drmas_train.collect.progress.TokenProgress`).

    Attributes:
        last_generations: the :class:`Generation` s of the latest call (token ids, log-probs, finish reason).
    """

    def __init__(self, backend: Backend, sampling: SamplingParams | None = None, *, progress: bool = False) -> None:
        self.backend = backend
        self.sampling = (sampling or SamplingParams()).replace(n=1)
        self.progress = progress
        self.last_generations: list[Any] = []

    @classmethod
    def from_model(
        cls,
        name_or_path: str = "smollm2-135m-instruct",
        *,
        backend: str = "hf",
        base_url: str | None = None,
        backend_kwargs: Mapping[str, Any] | None = None,
        progress: bool = False,
        **sampling: Any,
    ) -> LLMPolicy:
        """A policy over a model served by ``backend``.

        Args:
            name_or_path: ``hf`` / ``vllm``: a named offline model, local path or HF id
                (:func:`drmas_train.model.models.load_model`); ``openai``: the model name the server serves.
            backend: ``hf`` (transformers in this process, CPU/GPU), ``vllm`` (an in-process vLLM engine) or
                ``openai`` (any OpenAI-compatible server at ``base_url``, e.g. ``drmas serve``
                or ``vllm serve``).
            base_url: the server's ``/v1`` URL (``openai`` only; required there), e.g. ``http://127.0.0.1:8000/v1``.
            backend_kwargs: more keyword arguments of the backend class (:class:`~drmas_train.backends.hf.HFBackend`,
                :class:`~drmas_train.backends.vllm.VLLMBackend`, :class:`~drmas_train.backends.openai.OpenAIBackend`).
            progress: a bar of generated tokens during each call (see the class).
            sampling: :class:`SamplingParams` fields (e.g. ``temperature=0.7, max_new_tokens=256``).

        Raises:
            ValueError: an unknown ``backend`` (the accepted ones are listed), ``base_url`` missing for ``openai`` or
                given for another backend, or a bad sampling field.
        """
        params = SamplingParams(**sampling)
        kwargs = dict(backend_kwargs or {})
        if backend not in ("hf", "vllm", "openai"):
            raise ValueError(f"backend must be one of 'hf', 'vllm', 'openai', got {backend!r}")
        if backend == "openai":
            if not base_url:
                raise ValueError("backend='openai' needs base_url, the server's /v1 URL (e.g. http://127.0.0.1:8000/v1)")
            from drmas_train.backends.openai import OpenAIBackend

            return cls(OpenAIBackend(base_url, name_or_path, **kwargs), params, progress=progress)
        if base_url is not None:
            raise ValueError(f"base_url is only for backend='openai', got backend={backend!r}")
        from drmas_train.backends.factory import make_backend
        from drmas_train.model.models import load_model

        return cls(make_backend(load_model(name_or_path), backend, **kwargs), params, progress=progress)

    def __call__(self, observation: Any, *, desc: str = "generate") -> str:
        """The action text for one observation (``desc`` labels the progress bar)."""
        return self.batch([observation], desc=desc)[0]

    def batch(self, observations: Sequence[Any], *, desc: str = "generate") -> list[str]:
        """Action texts for several observations in one batched generate call (``desc`` labels the progress bar)."""
        prompts: list[Messages] = [_messages(o) for o in observations]
        if not (self.progress and reports_tokens(self.backend)):
            self.last_generations = self.backend.generate(prompts, self.sampling)
        else:
            with TokenProgress(len(prompts), self.sampling.max_new_tokens, desc=desc) as bar:
                self.last_generations = self.backend.generate(prompts, self.sampling, on_tokens=bar)
        return [g.text for g in self.last_generations]
