"""benchmarks/crossplay/paired.py: paired per-task effects of one role's player between crossplay cells, on
hand-built crossplay folders whose numbers are worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from drmas_train.eval.results import episode_row, write_run
from helpers.eval_rows import make_summary
from helpers.scripts import load_script

paired = load_script("benchmarks/crossplay/paired.py", "crossplay_paired")


def _player(label: str, iteration: int) -> dict:
    return {"label": label, "model": {"name_or_path": f"m{iteration}"}, "info": {"iteration": iteration}}


def _grid(
    folder: Path, fixed_search: tuple[str, int], won: dict[tuple[int, int], dict[str, list[bool]]]
) -> Path:
    """A 2x2 Verifier (rows: base, iter 8) x Answer (cols: iter 8, base) grid, the Search agent fixed."""
    rows, cols = [_player("base", 0), _player("iter 8", 8)], [_player("iter 8", 8), _player("base", 0)]
    cells = []
    for i in range(2):
        row = []
        for j in range(2):
            cell = folder / "cells" / f"r{i}_c{j}"
            episodes = [episode_row(run_id="r1", env_id="search-orchestrator-v0", data_source="synthetic", task_id=t,
                                    sample_index=s, seed=s, policy="llm", agent_models={}, num_turns=2,
                                    reward=float(w), won=w, returns={}, calls={"verifier": 1, "answer": 1},
                                    invalid_actions={"verifier": i, "answer": 0}, tokens_in={}, tokens_out={},
                                    wall_time_s=0.0)
                        for t, ws in won[i, j].items() for s, w in enumerate(ws)]  # fmt: skip
            write_run(cell, make_summary(episodes, k=len(next(iter(won[i, j].values())))), episodes)
            row.append({"result_dir": f"cells/r{i}_c{j}"})
        cells.append(row)
    meta = {"roles": {"rows": "verifier", "cols": "answer"}, "rows": rows, "cols": cols,
            "fixed": {"search": _player(*fixed_search)}, "cells": cells}  # fmt: skip
    (folder / "crossplay.json").write_text(json.dumps(meta))
    return folder


T, F = True, False


def test_effects_are_paired_per_task_differences_from_the_earlier_iteration(tmp_path):
    # per task, k = 2 samples; cell (i, j) = verifier row i, answer column j (column 0 = the TRAINED answer)
    won = {(0, 0): {"a": [T, T], "b": [T, F]}, (0, 1): {"a": [F, F], "b": [F, F]},
           (1, 0): {"a": [T, F], "b": [T, T]}, (1, 1): {"a": [T, F], "b": [F, F]}}  # fmt: skip
    out = paired.summarize([_grid(tmp_path / "s8", ("iter 8", 8), won)])
    cells = {tuple(sorted(c["assignment"].items())): c for c in out["cells"]}
    base_base = cells[(("answer", "base"), ("search", "iter 8"), ("verifier", "base"))]
    assert base_base["avg@k"] == 0.0 and base_base["tasks"] == 2
    trained = cells[(("answer", "iter 8"), ("search", "iter 8"), ("verifier", "iter 8"))]
    assert trained["avg@k"] == 0.75 and trained["agents"]["verifier"]["valid_call_share"] == 0.0
    effects = {(e["role"], tuple(sorted(e["context"].items()))): e for e in out["effects"]}
    assert len(out["effects"]) == 4 and all(
        (e["from"], e["to"]) == ("base", "iter 8") for e in out["effects"]
    )
    # answer base -> iter 8 with the base verifier: task a 0 -> 1, task b 0 -> 0.5: diffs (1, 0.5)
    e = effects["answer", (("search", "iter 8"), ("verifier", "base"))]
    assert e["diff"] == 0.75 and e["stderr"] == pytest.approx(math.sqrt(0.125 / 2)) and e["tasks"] == 2
    # verifier base -> iter 8 with the trained answer: task a 1 -> 0.5, task b 0.5 -> 1: diffs (-0.5, 0.5)
    e = effects["verifier", (("answer", "iter 8"), ("search", "iter 8"))]
    assert e["diff"] == 0.0 and e["stderr"] == pytest.approx(0.5)


def test_two_grids_make_a_factorial_and_a_repeated_cell_is_kept_once(tmp_path):
    same = {(i, j): {"a": [T, F]} for i in range(2) for j in range(2)}
    other = {(i, j): {"a": [F, F]} for i in range(2) for j in range(2)}
    out = paired.summarize([_grid(tmp_path / "s8", ("iter 8", 8), same), _grid(tmp_path / "s0", ("base", 0), other),
                            _grid(tmp_path / "again", ("iter 8", 8), other)])  # fmt: skip
    assert len(out["cells"]) == 8  # the third folder repeats the first's assignments: the first is kept
    search = [e for e in out["effects"] if e["role"] == "search"]
    assert len(search) == 4 and all(
        (e["from"], e["to"], e["diff"]) == ("base", "iter 8", 0.5) for e in search
    )
    assert len(out["effects"]) == 12  # 3 roles x 4 contexts of the other two


def test_a_folder_that_is_no_crossplay_output_exits_2(tmp_path, capsys):
    assert paired.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"paired.py: {tmp_path / 'crossplay.json'}: no such file")
