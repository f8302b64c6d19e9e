"""Nothing a user types loses a run: ``drmas train`` driven as a user drives it (the CLI entry point, a tiny model).

* a refused command (bad config, unknown model, a ``--overwrite`` that fails validation) leaves every file of the
  earlier run byte-identical and writes nothing beside it;
* ``--resume`` of a finished run is a no-op that says so and changes no byte;
* ``--overwrite`` removes the whole earlier run (no file of it is left), and refuses entries it did not write;
* ``--resume`` with more iterations continues, appends, and its ``summary.json`` describes the whole run.
"""

from __future__ import annotations

import json

import pytest
import torch

from drmas_train.commands.train import main as train_main
from drmas_train.run.metrics_log import read_metrics
from helpers.tiny_rl import tiny_config


def _snapshot(folder):
    """Every file under ``folder`` (relative path -> bytes), and every folder (relative path -> None)."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture
def finished(tmp_path, capsys):
    """A finished 2-iteration run with validation and a plot; returns (base CLI args, run dir)."""
    run_dir = tmp_path / "run"
    tiny_config(run_dir)
    base = ["--config", str(tmp_path / "run.yaml"), "models.m.name_or_path=tiny-llama", "run.iterations=2",
            "eval.every=1", "eval.size=2", "eval.k=2", "eval.before_train=true", "run.plot=true"]  # fmt: skip
    assert train_main(base) == 0
    capsys.readouterr()
    files = _snapshot(run_dir)
    assert {"summary.json", "metrics.jsonl", "training_curves.png", "validation/iter_000002.json",
            "checkpoints/iter_000002/trainer_state.pt"} <= set(files)  # fmt: skip
    return base, run_dir


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["env.id=search-orchestrator-v0", "--overwrite"], r"agent\(s\) \[.verifier., .search., .answer.\] have no model"),
        (["models.m.name_or_path=/no/such/model", "--overwrite"], r"models: model path '/no/such/model' is not an existing"),
        (["rollout.group_size=1", "--overwrite"], r"rollout.group_size must be >= 2"),
        (["rollout.group_siz=4", "--overwrite"], r"unknown config key 'rollout.group_siz'\. Did you mean: 'group_size'\?"),
        (["run.iterations=3"], r"already holds an earlier run \(checkpoint iter_000002\)"),
        ([], r"already holds a finished run \(checkpoint iter_000002, run.iterations=2\); refusing to overwrite it\. "
             r"Continue it with --resume and run.iterations above 2, start elsewhere"),
        (["--resume", "--overwrite"], r"--resume and --overwrite exclude each other"),
    ],
)
@pytest.mark.slow
def test_a_refused_command_changes_no_byte(finished, tmp_path, capsys, extra, message):
    import re

    base, run_dir = finished
    before, beside = _snapshot(run_dir), sorted(p.name for p in tmp_path.iterdir())
    assert train_main(base + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and re.search(message, err), err
    assert _snapshot(run_dir) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == beside  # nothing written beside it either


@pytest.mark.slow
def test_resume_of_a_finished_run_is_a_no_op_that_says_so(finished, tmp_path, capsys):
    base, run_dir = finished
    before, beside = _snapshot(run_dir), sorted(p.name for p in tmp_path.iterdir())
    assert train_main([*base, "--resume"]) == 0
    out = capsys.readouterr().out
    assert out == (f"drmas train: run.dir {str(run_dir)!r} already finished at iter 2 of 2; nothing to do "
                   "(raise run.iterations above 2 to continue it)\n")  # fmt: skip
    assert _snapshot(run_dir) == before and sorted(p.name for p in tmp_path.iterdir()) == beside


@pytest.mark.slow
def test_overwrite_leaves_no_file_of_the_earlier_run(finished, tmp_path, capsys):
    base, run_dir = finished
    old = _snapshot(run_dir)
    args = [a for a in base if not a.startswith(("run.iterations", "eval.before_train"))] + ["run.iterations=1"]
    assert train_main([*args, "--overwrite"]) == 0
    fresh = tmp_path / "fresh"
    assert train_main([*args, f"run.dir={fresh}"]) == 0
    new = _snapshot(run_dir)
    # exactly the files a fresh run writes: the earlier run's iteration 0 and 2 validations and checkpoint are gone
    assert set(new) == set(_snapshot(fresh))
    assert "validation/iter_000000.json" not in new and "validation/iter_000002.json" in old
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]  # the moved-aside copy is deleted
    assert [r["iteration"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1]


@pytest.mark.slow
def test_overwrite_refuses_entries_it_did_not_write(finished, capsys):
    base, run_dir = finished
    (run_dir / "notes.txt").write_text("my notes")
    before = _snapshot(run_dir)
    assert train_main([*base, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "also holds ['notes.txt'], which drmas train never writes; refusing to delete them" in err
    assert _snapshot(run_dir) == before


@pytest.mark.slow
def test_resume_continues_and_the_summary_covers_the_whole_run(finished, capsys):
    base, run_dir = finished
    first = json.loads((run_dir / "summary.json").read_text())
    assert train_main([*base, "--resume", "run.iterations=3"]) == 0
    out = capsys.readouterr().out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [r["iteration"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2, 3]
    assert sorted(summary["validation"], key=int) == ["0", "1", "2", "3"]  # both processes' validations
    assert summary["validation"]["2"] == first["validation"]["2"]
    assert summary["metrics"] == {k: v for k, v in read_metrics(run_dir / "metrics.jsonl")[-1].items() if k != "iteration"}
    assert summary["checkpoint"].endswith("iter_000003")
    # wall time: the first process's up to its last checkpoint (recorded in it), plus this one's
    before = torch.load(run_dir / "checkpoints" / "iter_000002" / "trainer_state.pt", weights_only=True)
    assert 0 < before["extra"]["elapsed_s"] <= first["wall_time_s"]
    assert summary["wall_time_s"] - summary["process_wall_time_s"] == pytest.approx(before["extra"]["elapsed_s"], abs=0.05)
    assert "; the whole run's training, resumes included: " in out


@pytest.mark.slow
def test_disk_full_at_the_first_save_exits_2_and_the_hints_agree(tmp_path, capsys, monkeypatch):
    """An injected ENOSPC at the first checkpoint: one line naming the cause and that nothing survived, exit 2. Then
    the plain command and ``--resume`` both point at ``--overwrite`` (neither at the other), and it works."""
    import errno
    import os
    import re

    run_dir = tmp_path / "run"
    tiny_config(run_dir)
    base = ["--config", str(tmp_path / "run.yaml"), "models.m.name_or_path=tiny-llama", "run.iterations=1"]

    def enospc(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(torch, "save", enospc)
        assert train_main(base) == 2
    err = capsys.readouterr().err  # the iteration's log line before it; the error is the last line, alone
    assert "Traceback" not in err and err.endswith("\n"), err
    err = err.rstrip("\n").rsplit("\n", 1)[-1] + "\n"
    assert re.fullmatch(r"drmas train: checkpoint iter_000001 not saved: no space left on device under "
                        rf"{re.escape(str(run_dir / 'checkpoints'))} \(\d+(\.\d)? [kMG]?B were written when it ran out; "
                        r".* free once the partial checkpoint was removed\); no checkpoint of this run survived; free "
                        r"space and start it again with --overwrite \(or elsewhere with run.dir=<new dir>\)\n", err), err
    assert train_main(base) == 2
    assert ("already holds an earlier run (metrics.jsonl, no complete checkpoint, so --resume cannot continue it); "
            "refusing to overwrite it. Start it again with --overwrite") in capsys.readouterr().err
    assert train_main([*base, "--resume"]) == 2
    assert ("--resume: no complete checkpoint under " in (err := capsys.readouterr().err)
            and "cannot be continued; start it again with --overwrite" in err), err  # fmt: skip
    assert train_main([*base, "--overwrite"]) == 0
    assert (run_dir / "checkpoints" / "iter_000001" / "trainer_state.pt").is_file()
