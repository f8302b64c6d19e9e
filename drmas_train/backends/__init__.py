"""LLM backends behind one protocol (:mod:`drmas_train.backends.base`): ``hf`` (transformers, the embedded
default), ``vllm`` (in-process engine, optional) and ``openai`` (OpenAI-compatible HTTP client).

Floor 3 of drmas_train (over errors, data, model; docs/architecture.md).

Only the protocol is imported here; each backend module imports its heavy dependencies itself.
"""

from drmas_train.backends.base import Backend, Generation, PromptTooLongError, SamplingParams

__all__ = ["Backend", "Generation", "SamplingParams", "PromptTooLongError"]
