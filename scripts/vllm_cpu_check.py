"""Real-vLLM check of drmas's vLLM generation path, on vLLM's CPU build (run by ``scripts/vllm_cpu_check.sh``).

The Ray :class:`~drmas_train.distributed.vllm_worker.VLLMGenerationWorker` runs as an actor in the vLLM venv
(``--vllm-python``, Ray ``runtime_env.py_executable``: exactly what ``distributed.vllm_python`` does in a run) on
SmolLM2-135M-Instruct in float32; this driver holds the trainer's view of the same weights (transformers, float32) and
compares. Steps, in order (each reports ``ok`` and its wall time ``s``):

``versions``   vLLM / torch / transformers / Ray of both interpreters; vLLM >= ``VLLM_MIN_VERSION`` (= the ``vllm``
               extra's floor in ``pyproject.toml``); the actor's Ray == the driver's.
``sleep_mode`` whether the platform has vLLM's sleep mode, asked of vLLM itself: ``is_sleep_mode_available()`` and
               what ``EngineArgs(enable_sleep_mode=True).create_model_config()`` says (the CPU build: a ValueError).
``startup``    the actor starts the engine; comes up with version -1 (asleep where sleep mode is on).
``stale``      a call before any push raises ``StaleWeightsError``.
``push``       ``load_weights`` of the model's own weights (v0): every tensor, in place.
``generate``   greedy and seeded sampled (``n=2``, T=0.7) generations; the engine's log-probs against
               ``forward_logprobs`` of the driver's model on the same tokens (max / mean |delta log p|, nats); the same
               seed twice gives the same samples.
``push_changed`` ``load_weights`` of a different state dict (v1: every weight + 0.1 x its std x N(0, 1)); the greedy
               texts change, the log-probs match the new weights' forward and are far from the old weights'.
``sleep``      ``sleep()`` then a push that wakes it: run where sleep mode is available, else skipped (the reason).
``restart``    SIGKILL of the actor's process; Ray restarts it (``max_restarts=1``); it comes back with version -1
               (asleep where sleep mode is on), a call raises ``StaleWeightsError``, the v1 weights are re-pushed and
               greedy generation gives the same tokens as before the kill.
``backend``    the in-process backend :class:`~drmas_train.backends.vllm.VLLMBackend` (``from_loaded``, chat prompts,
               ``sync_weights`` of a changed model) in a task in the vLLM venv, log-probs against that process's
               forward (``--no-backend`` skips it).
``train``      with ``--train`` only (needs this driver to have drmas's training dependencies): one iteration of
               ``drmas train --config quickstart_math`` (2 tasks x 2 rollouts, 16 new tokens) on Ray CPU workers with
               the overrides of :func:`drmas_train.distributed.vllm_cpu.vllm_cpu_overrides`: the trainer's worker
               group, its training rank and a vLLM generation worker in the venv; reports the run's wall time and its
               ``perf/*`` metrics.

Prints ONE JSON object on stdout (``ok``, ``vllm_version``, ``steps``, ``logprob_abs_diff``, ``load``, ``install``);
logs go to stderr. Exit codes: 0 all checks true, 1 a check failed or a step raised, 2 bad arguments, 3 the vLLM
interpreter does not import vLLM / Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = (
    "What is 2 + 3? Answer briefly.",
    "Name a colour of the sky.",
    "Say hello to a friend in one sentence.",
)

PROBE = r"""
import json, sys
out = {}
import vllm, torch, transformers, ray
out.update(vllm=vllm.__version__, torch=torch.__version__, transformers=transformers.__version__, ray=ray.__version__)
from vllm.platforms import current_platform
out["platform"] = type(current_platform).__name__
out["sleep_mode_available"] = bool(current_platform.is_sleep_mode_available())
try:
    from vllm.engine.arg_utils import EngineArgs
    EngineArgs(model=sys.argv[1], enable_sleep_mode=True).create_model_config()
    out["enable_sleep_mode"] = "accepted"
except Exception as err:  # vLLM's own words: the line that names sleep mode, else the first line
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()] or [""]
    said = next((ln for ln in lines if "leep mode" in ln), lines[0]).split(" [type=")[0]  # pydantic's suffix
    out["enable_sleep_mode"] = f"{type(err).__name__}: {said}"
print(json.dumps(out))
"""


def perturbed(state: dict[str, Any], scale: float = 0.1, seed: int = 0) -> dict[str, Any]:
    """Every floating tensor plus ``scale * std(tensor) * N(0, 1)`` noise (a fixed generator; a constant tensor, e.g. a
    freshly initialised norm, has std 0 and stays as it is): a state dict of the same names and shapes whose
    next-token distributions differ clearly from the original's."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        if t.is_floating_point() and t.numel() > 1:
            t = t + scale * t.float().std() * torch.randn(t.shape, generator=gen, dtype=t.dtype)
        out[name] = t.detach().clone()
    return out


def logprob_diff(model: Any, gens: list[Any], pad: int, temperature: float) -> dict[str, float]:
    """max and mean |engine log-prob - forward_logprobs| over the generated tokens (nats), and the token count."""
    import torch

    from drmas_train.model.logprobs import forward_logprobs

    with torch.no_grad():
        lp, mask, _ = forward_logprobs(model, [g.prompt_ids for g in gens], [g.response_ids for g in gens],
                                       pad_token_id=pad, temperature=temperature)  # fmt: skip
    engine = torch.zeros_like(lp)
    for i, g in enumerate(gens):
        engine[i, : len(g.logprobs)] = torch.tensor(g.logprobs, dtype=lp.dtype)
    diff = ((lp - engine).abs() * mask)[mask.bool()]
    return {
        "max": round(float(diff.max()), 6),
        "mean": round(float(diff.mean()), 7),
        "tokens": int(mask.sum()),
    }


def backend_check(model_name: str, max_new_tokens: int) -> dict[str, Any]:
    """The in-process :class:`VLLMBackend` (runs in the vLLM venv): start-up, generation, log-probs against this
    process's forward pass, ``sync_weights`` of a changed model. Returns the step's fields."""
    import tempfile

    import torch

    from drmas_train.backends.base import SamplingParams
    from drmas_train.backends.vllm import VLLMBackend
    from drmas_train.model.models import ModelSpec, load_model

    res: dict[str, Any] = {}
    loaded = load_model(ModelSpec(model_name, dtype="float32"), "policy")
    with tempfile.TemporaryDirectory(prefix="drmas-vllm-backend-") as export:
        t0 = time.perf_counter()
        backend = VLLMBackend.from_loaded(loaded, export_dir=export, max_model_len=512, enforce_eager=True)
        res["startup_s"] = round(time.perf_counter() - t0, 2)
        prompts = [[{"role": "user", "content": q}] for q in PROMPTS]
        greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        before = backend.generate(prompts, greedy)
        res["texts"] = [g.text for g in before]
        res["logprob_abs_diff"] = logprob_diff(loaded.model, before, backend.pad_token_id, 1.0)
        with torch.no_grad():
            loaded.model.load_state_dict(perturbed(loaded.model.state_dict()))
        t0 = time.perf_counter()
        backend.sync_weights()
        res["sync_s"] = round(time.perf_counter() - t0, 2)
        after = backend.generate(prompts, greedy)
        res["greedy_changed_after_sync"] = [g.response_ids for g in after] != [g.response_ids for g in before]
        res["after_sync_logprob_abs_diff"] = logprob_diff(loaded.model, after, backend.pad_token_id, 1.0)
    return res


class Check:
    """Runs the steps, records each one's result and time; the JSON report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: dict[str, Any] = {"ok": False, "vllm_version": None, "model": args.model, "steps": {},
                                    "logprob_abs_diff": {}}  # fmt: skip
        self.failed: list[str] = []

    def step(self, name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        rec: dict[str, Any] = {}
        self.out["steps"][name] = rec
        try:
            value = fn(rec)
        except Exception as err:  # the step's failure is reported; later steps may still run
            traceback.print_exc()
            rec["error"] = f"{type(err).__name__}: {err}"[:2000]
            rec["ok"] = False
            value = None
        rec["s"] = round(time.perf_counter() - t0, 2)
        rec.setdefault("ok", True)
        if rec["ok"] is False:
            self.failed.append(name)
        print(f"[vllm_cpu_check] {name}: {json.dumps(rec)[:600]}", file=sys.stderr, flush=True)
        return value

    def expect(self, rec: dict[str, Any], what: str, cond: bool) -> None:
        rec.setdefault("checks", {})[what] = bool(cond)
        if not cond:
            rec["ok"] = False


def run(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    import ray
    import torch
    from ray.exceptions import ActorUnavailableError, RayActorError
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

    from drmas_train.backends.base import SamplingParams, render_chat
    from drmas_train.backends.vllm import VLLM_MIN_VERSION, check_vllm_version
    from drmas_train.distributed.generation_engines import vllm_runtime_env
    from drmas_train.distributed.vllm_worker import VLLMGenerationWorker
    from drmas_train.distributed.workers import StaleWeightsError
    from drmas_train.model.models import ModelSpec, cache_dir, load_model

    c = Check(args)
    out = c.out
    out["load"] = {"loadavg_start": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    install = (
        Path(args.vllm_python).parent.parent / "drmas-install.json"
    )  # written by vllm_cpu_check.sh (venv root)
    out["install"] = json.loads(install.read_text()) if install.is_file() else None
    spec = ModelSpec(args.model, dtype="float32")
    loaded = load_model(
        spec, "policy"
    )  # the trainer's view; also materialises the HF folder the engine starts from
    model, tok = loaded.model.eval(), loaded.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    prompts = [render_chat(tok, [{"role": "user", "content": q}], spec.chat_template_kwargs) for q in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    sampled = SamplingParams(temperature=0.7, max_new_tokens=args.max_new_tokens, n=2, seed=7)

    def versions(rec):
        import tomllib

        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        probe = subprocess.run([args.vllm_python, "-c", PROBE, str(cache_dir() / args.model)], capture_output=True,
                               text=True, timeout=300, env=env)  # fmt: skip
        if probe.returncode != 0:
            raise RuntimeError(f"{args.vllm_python} cannot import vLLM/Ray: {probe.stderr[-1500:]}")
        info = json.loads(probe.stdout.strip().splitlines()[-1])
        out["vllm_version"] = info["vllm"]
        rec["vllm_python"] = {k: info[k] for k in ("vllm", "torch", "transformers", "ray", "platform")}
        rec["driver"] = {"python": sys.executable, "torch": torch.__version__, "ray": ray.__version__,
                         "transformers": __import__("transformers").__version__}  # fmt: skip
        rec["vllm_min_version"] = VLLM_MIN_VERSION
        extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
            "vllm"
        ]
        rec["pyproject_vllm_extra"] = extra
        try:
            check_vllm_version(info["vllm"])
            at_least_floor = True
        except ImportError:
            at_least_floor = False
        c.expect(rec, "vllm_at_least_floor", at_least_floor)
        c.expect(rec, "pyproject_floor_is_VLLM_MIN_VERSION", extra == [f"vllm>={VLLM_MIN_VERSION}"])
        c.expect(rec, "same_ray_version", info["ray"] == ray.__version__)
        return info

    info = c.step("versions", versions)
    if info is None:
        return out, 3
    sleep_on = info["sleep_mode_available"]

    def sleep_mode(rec):
        rec.update(available=sleep_on, platform=info["platform"], enable_sleep_mode=info["enable_sleep_mode"])
        # detected, not assumed: vLLM's own config must agree with the platform's answer
        c.expect(rec, "config_agrees_with_platform", (info["enable_sleep_mode"] == "accepted") == sleep_on)

    c.step("sleep_mode", sleep_mode)

    ray.init(num_cpus=max(2, args.threads + 1), include_dashboard=False, log_to_driver=args.verbose)
    actor_cls = ray.remote(VLLMGenerationWorker).options(
        max_restarts=1, max_task_retries=0, num_cpus=1,
        runtime_env=vllm_runtime_env(args.vllm_python, cpu=True))  # fmt: skip
    engine_kwargs = {"max_model_len": 512, "enforce_eager": True, "seed": 0}
    worker = actor_cls.remote(
        spec, "policy", threads=args.threads, use_gpu=False, engine_kwargs=engine_kwargs
    )

    def startup(rec):
        status = ray.get(worker.status.remote())
        rec["status"] = status
        c.expect(rec, "version_is_-1", status["version"] == -1)
        c.expect(rec, "sleep_mode_as_platform", status["sleep_mode"] == sleep_on)
        c.expect(rec, "asleep_iff_sleep_mode", bool(status["asleep"]) == sleep_on)
        return status

    status = c.step("startup", startup)
    if status is None:
        return out, 1

    def expect_stale(rec, version):
        try:
            ray.get(worker.generate_ids.remote(prompts, greedy, version))
            c.expect(rec, "raises_StaleWeightsError", False)
        except (
            StaleWeightsError
        ) as err:  # Ray's task error is also an instance of the remote exception's class
            rec["error_message"] = str(err).splitlines()[-1][:300]
            c.expect(rec, "raises_StaleWeightsError", True)

    c.step("stale", lambda rec: expect_stale(rec, 0))
    state0 = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def push(rec, state, version):
        ref = ray.put(state)
        t0 = time.perf_counter()
        got = ray.get(worker.load_weights.remote(ref, version))
        rec["load_weights_s"] = round(time.perf_counter() - t0, 3)
        rec["tensors"] = len(state)
        c.expect(rec, "returns_version", got == version)
        st = ray.get(worker.status.remote())
        c.expect(rec, "awake_after_push", st["asleep"] == [])

    c.step("push", lambda rec: push(rec, state0, 0))

    def generate(rec):
        t0 = time.perf_counter()
        g = ray.get(worker.generate_ids.remote(prompts, greedy, 0))
        dt = time.perf_counter() - t0
        rec["greedy_tokens"] = [len(x.response_ids) for x in g]
        rec["tokens_per_s"] = round(sum(rec["greedy_tokens"]) / dt, 1)
        rec["texts"] = [x.text for x in g]
        s1 = ray.get(worker.generate_ids.remote(prompts, sampled, 0))
        s2 = ray.get(worker.generate_ids.remote(prompts, sampled, 0))
        c.expect(rec, "n_rows", len(g) == len(prompts) and len(s1) == 2 * len(prompts))
        c.expect(
            rec, "one_logprob_per_token", all(len(x.logprobs) == len(x.response_ids) > 0 for x in [*g, *s1])
        )
        c.expect(rec, "seeded_reproducible", [x.response_ids for x in s1] == [x.response_ids for x in s2])
        c.expect(rec, "n_samples_differ", any(s1[2 * i].response_ids != s1[2 * i + 1].response_ids
                                               for i in range(len(prompts))))  # fmt: skip
        d = out["logprob_abs_diff"]
        d["greedy"] = logprob_diff(model, g, pad, 1.0)
        d["sampled_T0.7"] = logprob_diff(model, s1, pad, 0.7)
        for key in ("greedy", "sampled_T0.7"):
            c.expect(
                rec,
                f"logprobs_match_forward_{key}",
                d[key]["max"] < args.tol_max and d[key]["mean"] < args.tol_mean,
            )
        return g

    before = c.step("generate", generate)
    state1 = perturbed(state0)

    def push_changed(rec):
        push(rec, state1, 1)
        g = ray.get(worker.generate_ids.remote(prompts, greedy, 1))
        rec["texts"] = [x.text for x in g]
        c.expect(
            rec,
            "greedy_changed",
            before is not None and [x.response_ids for x in g] != [x.response_ids for x in before],
        )
        model.load_state_dict(state1)
        new = logprob_diff(model, g, pad, 1.0)
        model.load_state_dict(state0)
        old = logprob_diff(model, g, pad, 1.0)
        out["logprob_abs_diff"]["after_push_vs_pushed_weights"] = new
        out["logprob_abs_diff"]["after_push_vs_initial_weights"] = old
        c.expect(
            rec, "logprobs_match_pushed_weights", new["max"] < args.tol_max and new["mean"] < args.tol_mean
        )
        c.expect(rec, "logprobs_far_from_initial_weights", old["mean"] > 10 * max(new["mean"], 1e-4))
        return g

    changed = c.step("push_changed", push_changed)

    def sleep(rec):
        if not sleep_on:
            rec["skipped"] = f"vLLM's {info['platform']} has no sleep mode ({info['enable_sleep_mode']})"
            rec["ok"] = None
            return
        c.expect(rec, "asleep", ray.get(worker.sleep.remote()) is True)
        push(rec, state1, 2)  # the wake-up path of a training iteration
        g = ray.get(worker.generate_ids.remote(prompts, greedy, 2))
        c.expect(
            rec, "same_tokens_after_wake", [x.response_ids for x in g] == [x.response_ids for x in changed]
        )

    c.step("sleep", sleep)
    version = 2 if sleep_on else 1

    def restart(rec):
        old_pid = ray.get(worker.pid.remote())
        t0 = time.perf_counter()
        os.kill(old_pid, signal.SIGKILL)
        for attempt in Retrying(retry=retry_if_exception_type((RayActorError, ActorUnavailableError, AssertionError)),
                                stop=stop_after_delay(600), wait=wait_exponential(multiplier=0.2, max=3.0)):  # fmt: skip
            with attempt:
                st = ray.get(worker.status.remote())
                assert st["pid"] != old_pid
        rec["restart_s"] = round(time.perf_counter() - t0, 2)
        rec["status_after_restart"] = st
        c.expect(rec, "new_process", st["pid"] != old_pid)
        c.expect(rec, "version_is_-1", st["version"] == -1)
        c.expect(rec, "asleep_iff_sleep_mode", bool(st["asleep"]) == sleep_on)
        expect_stale(rec, version)
        push(rec, state1, version)
        g = ray.get(worker.generate_ids.remote(prompts, greedy, version))
        c.expect(rec, "same_tokens_as_before_the_kill",
                 changed is not None and [x.response_ids for x in g] == [x.response_ids for x in changed])  # fmt: skip

    c.step("restart", restart)
    try:
        import psutil

        out["load"]["engine_rss_mb"] = round(
            psutil.Process(ray.get(worker.pid.remote())).memory_info().rss / 2**20, 1
        )
    except Exception:  # the figure is informative only
        pass
    ray.kill(worker, no_restart=True)

    def backend(rec):
        if args.no_backend:
            rec["skipped"], rec["ok"] = "--no-backend", None
            return
        task = ray.remote(backend_check).options(
            num_cpus=1, runtime_env=vllm_runtime_env(args.vllm_python, cpu=True)
        )
        res = ray.get(task.remote(args.model, args.max_new_tokens))
        rec.update(res)
        out["logprob_abs_diff"]["backend_greedy"] = res["logprob_abs_diff"]
        out["logprob_abs_diff"]["backend_after_sync"] = res["after_sync_logprob_abs_diff"]
        for key in ("logprob_abs_diff", "after_sync_logprob_abs_diff"):
            d = res[key]
            c.expect(rec, f"{key}_small", d["max"] < args.tol_max and d["mean"] < args.tol_mean)
        c.expect(rec, "greedy_changed_after_sync", res["greedy_changed_after_sync"])

    c.step("backend", backend)
    ray.shutdown()

    def train(rec):
        if not args.train:
            rec["skipped"], rec["ok"] = "no --train", None
            return
        import tempfile

        from drmas_train.distributed.vllm_cpu import vllm_cpu_overrides

        with tempfile.TemporaryDirectory(prefix="drmas-vllm-train-") as run_dir:
            cmd = [sys.executable, "-m", "drmas_train.cli", "train", "--config", "quickstart_math",
                   "run.iterations=1", f"run.dir={run_dir}", "run.num_threads=1", "run.save_samples=false",
                   "rollout.batch_size=2", "rollout.group_size=2", "rollout.max_new_tokens=16", "eval.every=0",
                   "eval.before_train=false", "distributed.enabled=true", "distributed.cpus_per_worker=1",
                   *vllm_cpu_overrides(args.vllm_python)]  # fmt: skip
            rec["command"] = " ".join(cmd[1:4] + cmd[5:])
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
            sys.stderr.write(proc.stderr[-4000:])
            metrics = Path(run_dir) / "metrics.jsonl"
            lines = metrics.read_text().splitlines() if metrics.is_file() else []
            last = json.loads(lines[-1]) if lines else {}
            rec["returncode"] = proc.returncode
            rec["metrics"] = {
                k: round(v, 2) for k, v in last.items() if k.startswith("perf/") or k == "iteration"
            }
            c.expect(rec, "exit_0", proc.returncode == 0)
            c.expect(rec, "one_iteration_logged", last.get("iteration") == 1)

    c.step("train", train)
    out["load"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["failed"] = c.failed
    out["ok"] = not c.failed
    return out, 0 if out["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--vllm-python", default=sys.executable, help="interpreter of the vLLM venv (default: this one)"
    )
    p.add_argument(
        "--model", default="smollm2-135m-instruct", help="drmas model name (head_dim in vLLM CPU's sizes)"
    )
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the engine actor")
    p.add_argument("--tol-max", type=float, default=5e-3, help="largest accepted max |delta log p| (nats)")
    p.add_argument("--tol-mean", type=float, default=5e-4, help="largest accepted mean |delta log p| (nats)")
    p.add_argument("--no-backend", action="store_true", help="skip the in-process VLLMBackend step")
    p.add_argument(
        "--train", action="store_true", help="also run one `drmas train` iteration with vLLM workers"
    )
    p.add_argument("--verbose", action="store_true", help="forward the actors' logs (vLLM's) to stderr")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1 or args.threads < 1:
        print(json.dumps({"ok": False, "error": "--max-new-tokens and --threads must be >= 1"}))
        return 2
    t0 = time.perf_counter()
    try:
        out, code = run(args)
    except Exception as err:  # reported in the JSON; the traceback goes to stderr
        traceback.print_exc()
        out, code = {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}, 1
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
