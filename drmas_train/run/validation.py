"""The held-out validation of a training run: avg@k and pass@k of the current policy on ``run.val_tasks``
(``eval.*``), per-task scores on disk, and the paired gain over the initial weights."""

from __future__ import annotations

import json

from drmas_train.run.state import RunState

__all__ = ["validate", "validation_line"]


def validate(run: RunState, iteration: int) -> dict[str, float]:
    """avg@k (with its standard error over tasks) and unbiased pass@k (``drmas_train.eval.metrics``) of the current
    policy on the held-out tasks; per-task scores go to ``run_dir/validation/iter_<N>.json``.

    When the run validated its initial weights (``eval.before_train``), later validations also report the paired
    gain over them: ``val/avg@k_gain`` = mean over tasks of (score now - score at iteration 0), with its standard
    error ``val/avg@k_gain_stderr`` (paired, so the tasks' difficulty spread cancels)."""
    from drmas_train.backends.base import SamplingParams
    from drmas_train.collect.rollout import rollout
    from drmas_train.eval.metrics import avg_at_k, mean_stderr, pass_at_k_tasks

    e, r = run.cfg.eval, run.cfg.rollout
    sampling = SamplingParams(temperature=e.temperature, top_p=e.top_p, top_k=e.top_k, max_new_tokens=r.max_new_tokens)
    result = rollout(run.env_fn, run.val_tasks, e.k, run.pool, sampling, seed=10_000_019 + iteration,
                     max_prompt_tokens=r.max_prompt_tokens, truncation=r.truncation, progress=run.cfg.run.progress,
                     label="validation")  # fmt: skip
    by_task: dict[str, list[bool]] = {}
    for t in result.trajectories:
        by_task.setdefault(t.task_id, []).append(bool(t.won))
    flags = list(by_task.values())
    avg = avg_at_k(flags)
    out = {f"val/avg@{e.k}": avg.value, f"val/avg@{e.k}_stderr": avg.stderr or 0.0,
           f"val/pass@{e.k}": pass_at_k_tasks([(len(f), sum(f)) for f in flags], e.k).value}  # fmt: skip
    scores = {task: sum(f) / len(f) for task, f in by_task.items()}
    folder = run.run_dir / "validation"
    folder.mkdir(exist_ok=True)
    (folder / f"iter_{iteration:06d}.json").write_text(json.dumps({"iteration": iteration, "k": e.k, "scores": scores}))
    first = folder / "iter_000000.json"
    if iteration > 0 and first.is_file():
        before = json.loads(first.read_text())["scores"]
        common = [t for t in scores if t in before]
        if len(common) >= 2:
            gain = mean_stderr([scores[t] - before[t] for t in common])
            out.update({f"val/avg@{e.k}_gain": gain.value, f"val/avg@{e.k}_gain_stderr": gain.stderr or 0.0})
    return out


def validation_line(iteration: int, m: dict[str, float]) -> str:
    """``validation avg@k = v ± se`` (and the paired gain over iteration 0 when known)."""
    key = next(k for k in m if k.startswith("val/avg@") and "_" not in k.split("@", 1)[1])
    line = f"iter {iteration}: validation {key[4:]} = {m[key]:.3f} ± {m[key + '_stderr']:.3f}"
    if key + "_gain" in m:
        line += f" (gain over iteration 0: {m[key + '_gain']:+.3f} ± {m[key + '_gain_stderr']:.3f}, paired)"
    return line
