"""``drmas rehearse``: every paper preset's wiring runs on a CPU, with tiny stand-ins and a few tasks.

* every paper preset and ``_dist`` twin gets a rehearsal config that loads and validates against its env (fast);
* every preset's rehearsal config equals, but for the estimator and the run's name and directory, the config of one
  of the presets rehearsed in full below (sizes 4B / 8B and 3B / 7B share their stand-in; a ``_dist`` twin adds the
  distributed section of the fully rehearsed ``_dist`` preset of its task, math or search); the estimators
  themselves run in the trainer on the tiny env (tests/drmas_train/run/test_trainer.py);
* a full rehearsal (train, checkpoint, --resume, drmas eval on the export) of each wiring: math and search x
  shared / non-sharing / heterogeneous, and two ``_dist`` presets on 2 gloo ranks (slow), the search ones against a
  server speaking the reference's retrieval protocol (one query per request: a Search-R1 batch body gets HTTP 422).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from drmas_train.run.config import list_presets, load_config
from drmas_train.run.rehearsal import rehearsal_config, rehearse, stand_in

PAPER = [p for p in list_presets() if p.startswith(("drmas_", "grpo_"))]
#: the presets rehearsed in full; every other paper preset is one of these but for its estimator and run name/dir
FULL = ["drmas_math_qwen3_4b", "drmas_math_qwen3_4b_nonsharing", "drmas_math_qwen3_4b_hetero", "drmas_search_qwen25_3b",
        "drmas_search_qwen25_3b_nonsharing", "drmas_search_qwen25_3b_hetero"]  # fmt: skip
FULL_DIST = ["drmas_math_qwen3_4b_dist", "drmas_search_qwen25_3b_hetero_dist"]


def test_every_paper_preset_is_listed():
    assert len(PAPER) == 40 and set(FULL + FULL_DIST) <= set(PAPER)


def test_stand_ins_keep_the_architecture_family():
    assert stand_in("Qwen/Qwen3-4B") == "tiny-qwen3" and stand_in("Qwen/Qwen2.5-7B") == "tiny-qwen2"
    assert stand_in("meta-llama/Llama-3.2-3B-Instruct") == stand_in("smollm2-135m-instruct") == "tiny-llama"
    with pytest.raises(ValueError, match="no tiny stand-in for model 'mistralai/Mistral-7B'"):
        stand_in("mistralai/Mistral-7B")


def _rehearsal(name: str, tmp_path, url: str):
    return rehearsal_config(load_config(name), tmp_path / name, retrieval_url=url)


def _wiring(cfg) -> dict:
    """The rehearsal config less what may differ between twins: the estimator, the run's name / dir, the data paths
    (each rehearsal writes its own) and the distributed section."""
    d = dataclasses.asdict(cfg)
    d["algorithm"].pop("estimator")
    d["run"].pop("dir"), d["run"].pop("name"), d["env"].pop("data"), d["eval"].pop("data"), d.pop("distributed")
    d["env"]["kwargs"].pop("tasks", None)
    return d


def _twin(name: str) -> str:
    """The fully rehearsed preset whose wiring ``name`` shares."""
    return name.replace("grpo_", "drmas_", 1).replace("qwen3_8b", "qwen3_4b").replace("qwen25_7b", "qwen25_3b").removesuffix("_dist")


@pytest.fixture(scope="module")
def reference_server():
    """The reference retrieval server's protocol over BM25 of the synthetic encyclopedia (drmas_envs.search.testing)."""
    from drmas_envs.search.retrievers import make_retriever
    from drmas_envs.search.synthetic import generate_encyclopedia
    from drmas_envs.search.testing import ReferenceProtocolServer

    with ReferenceProtocolServer(make_retriever("bm25", generate_encyclopedia().passages), start_timeout=300.0) as server:
        yield server


@pytest.mark.parametrize("name", PAPER)
def test_every_paper_preset_rehearses_as_a_fully_rehearsed_wiring(name, tmp_path, reference_server):
    from drmas_envs import make
    from drmas_train.run.config import validate_config
    from drmas_train.run.env_setup import make_probe_env

    cfg, replaced = _rehearsal(name, tmp_path, reference_server.url)
    assert all(m.name_or_path.startswith("tiny-") and m.device == "cpu" for m in cfg.models.values())
    assert {v["to"] for v in replaced["models"].values()} <= {"tiny-qwen3", "tiny-qwen2", "tiny-llama"}
    for where in replaced["data"].values():  # the preset's data paths, now a few tasks in its own format
        rows = [json.loads(line) for line in open(where["to"])]
        assert rows and {"task_id", "question", "answer"} <= set(rows[0])
    probe = make_probe_env(cfg, lambda: make(cfg.env.id, **dict(cfg.env.kwargs)))
    validate_config(cfg, list(probe.possible_agents))
    twin = _twin(name)
    assert twin in FULL
    rehearsed, _ = _rehearsal(twin, tmp_path, reference_server.url)
    assert _wiring(cfg) == _wiring(rehearsed), f"{name} wires differently from {twin}"
    if cfg.distributed.enabled:  # every _dist preset: 2 gloo ranks per model, as the fully rehearsed _dist preset of its task
        dist, _ = _rehearsal(FULL_DIST[0] if "_math_" in name else FULL_DIST[1], tmp_path, reference_server.url)
        ours, theirs = dataclasses.asdict(cfg.distributed), dataclasses.asdict(dist.distributed)
        assert ours.pop("world_size") == dict.fromkeys(cfg.models, 2) and theirs.pop("world_size")
        assert ours == theirs


def test_the_stand_in_server_refuses_a_search_r1_batch_as_the_reference_does(reference_server):
    import httpx

    assert httpx.post(reference_server.url, json={"queries": ["x"], "topk": 3}, timeout=60).status_code == 422
    reply = httpx.post(reference_server.url, json={"query": "Dormonlo", "topk": 2, "return_scores": True}, timeout=60)
    assert reply.status_code == 200 and len(reply.json()["result"][0]) == 2


@pytest.mark.slow  # a rehearsal loads tiny models, trains 3 iterations, validates, checkpoints and evaluates: ~40 s
@pytest.mark.parametrize("name", FULL + FULL_DIST)
def test_full_rehearsal(name, tmp_path):
    verdict = rehearse(name, tmp_path / "rehearsal")
    failed = [s for s in verdict["stages"] if not s.get("ok")]
    assert verdict["ok"], json.dumps(failed, indent=2)
    assert [s["stage"] for s in verdict["stages"]] == ["config", "train", "checkpoint", "resume", "eval"]
    assert len(verdict["stages"][1]["per_iteration"]) == 2 and verdict["stages"][4]["episodes"] == 2
    precision = verdict["stages"][1]["precision"]  # the preset's own: bf16 compute over float32 master weights
    assert precision and all(p["compute_dtype"] == "bfloat16" and p["trained_weights_dtype"] == "float32"
                             for p in precision.values()), precision  # fmt: skip
    moved = [f for p in precision.values() for f in p["update_changed_frac"] if f is not None and f == f]
    assert moved and min(moved) > 0.9, precision  # every update moved the weights that had a gradient
    idle = verdict["stages"][1]["not_updated"]  # named, not hidden: models no update reached
    assert idle == sorted(m for m, p in precision.items() if not any(x is not None for x in p["update_changed_frac"]))
    assert len(idle) < len(precision)
    from drmas_train.run.checkpoint import saved_model_weights

    exported = saved_model_weights(verdict["stages"][2]["path"])  # the checkpoint's exported models: the masters
    assert exported and {t.dtype for t in exported.values()} == {torch.float32}
    if name.endswith("_dist"):  # memory per rank is part of the verdict
        assert set(verdict["memory"]["rank_peak_rss_mb"]) == set(load_config(name).models)
    if "search" in name:  # the searches reached the stand-in of the reference's server, one query per request
        assert verdict["replaced"]["retrieval"]["to"].endswith("/retrieve")


@pytest.mark.slow
def test_a_rehearsal_fails_when_updates_leave_the_weights_unchanged(tmp_path):
    """bf16 weights stepped directly at the paper's lr 1e-6 (``optim.master_dtype: model``): the train stage fails and
    says why, where a float32 stand-in would have passed."""
    preset = tmp_path / "bf16_direct.yaml"
    from drmas_train.run.config import to_yaml

    cfg = load_config("drmas_math_qwen3_4b", ["optim.master_dtype=model"])
    preset.write_text(to_yaml(cfg))
    verdict = rehearse(str(preset), tmp_path / "rehearsal")
    train = verdict["stages"][1]
    assert not verdict["ok"] and train["stage"] == "train" and train["ok"] is False
    assert "updates with a non-zero gradient left the weights (nearly) unchanged" in train["error"]
    assert [s["ok"] for s in verdict["stages"][2:]] == [None, None, None]


@pytest.mark.slow
def test_a_vllm_rehearsal_keeps_vllm_engines_with_heads_vllm_cpu_can_run(tmp_path):
    """``drmas rehearse --vllm``: the _dist preset keeps its vLLM generation workers (CPU build, in the named
    interpreter), each stand-in rebuilt with heads of 32 (vLLM's CPU attention has no 16) from the same family and
    tokenizer; a single-process preset is refused with the reason. The real run: docs/scaling.md."""
    from transformers import AutoConfig

    from drmas_train.distributed.vllm_cpu import VLLM_CPU_HEAD_SIZES
    from drmas_train.errors import ConfigError
    from drmas_train.model.models import load_model

    cfg, replaced = rehearsal_config(load_config("drmas_math_qwen3_4b_hetero_dist"), tmp_path, vllm_python="/venv/bin/python")
    d = cfg.distributed
    assert (d.generation_engine, d.vllm_allow_cpu, d.vllm_python, d.vllm_kwargs["enforce_eager"]) == ("vllm", True, "/venv/bin/python", True)
    assert d.devices_per_node == 0 and d.world_size == dict.fromkeys(cfg.models, 2)
    assert all(replaced["models"][key]["to"] == m.name_or_path for key, m in cfg.models.items())
    (folder,) = {m.name_or_path for m in cfg.models.values()}  # Qwen3-4B and Qwen3-1.7B: one stand-in
    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == "qwen3" and config.head_dim in VLLM_CPU_HEAD_SIZES and config.hidden_size == 64
    # Qwen3's context (config.json of Qwen/Qwen3-4B): the preset's 8192 + 4096 fits, as on the real model
    assert config.max_position_embeddings == 40960 >= cfg.rollout.max_prompt_tokens + 4096
    loaded = load_model(folder)  # the folder loads offline, with the Qwen3 tokenizer and its chat template
    assert len(loaded.tokenizer) == 151669 and "enable_thinking" in loaded.tokenizer.chat_template
    with pytest.raises(ConfigError, match=r"--vllm rehearses the vLLM generation workers of a _dist preset"):
        rehearse("drmas_math_qwen3_4b", tmp_path / "single", vllm_python="/venv/bin/python")
    assert not (tmp_path / "single").exists()


def test_a_failed_stage_ends_the_rehearsal_and_is_named(tmp_path, monkeypatch):
    """The first failing stage is recorded with its error; the later ones are listed as not run (ok: None), and
    nothing after the failure executes (a skipped stage's body would fail for want of a checkpoint)."""
    import drmas_train.run.trainer as trainer

    def broken(cfg, **kwargs):
        raise RuntimeError("rank 1 died")

    monkeypatch.setattr(trainer, "train", broken)
    verdict = rehearse("drmas_math_qwen3_4b", tmp_path / "r")
    assert not verdict["ok"]
    assert [(s["stage"], s["ok"]) for s in verdict["stages"]] == [
        ("config", True), ("train", False), ("checkpoint", None), ("resume", None), ("eval", None)]
    assert verdict["stages"][1]["error"] == "RuntimeError: rank 1 died"
    assert json.loads((tmp_path / "r" / "verdict.json").read_text())["stages"][1]["ok"] is False
