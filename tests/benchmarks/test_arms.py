"""benchmarks/perf/arms.py: each arm in a fresh process (its last stdout line parsed as JSON, OMP_NUM_THREADS 1
unless set, the first failure stops the run with its stderr's tail), and the commands rank_memory.py and
lora_agents_memory.py re-run themselves with (their CLI: ``--arm`` / ``--child`` and the settings)."""

from __future__ import annotations

import json
import sys

import pytest

from helpers.scripts import ROOT, load_script

arms = load_script("benchmarks/perf/arms.py", "perf_arms")

#: a child that prints a line of noise, then one JSON line: its arm and the OMP_NUM_THREADS it got
CHILD = "import json, os, sys; print('noise'); print(json.dumps({'arm': sys.argv[1], 'omp': os.environ.get('OMP_NUM_THREADS')}))"


def test_each_arm_runs_in_order_and_its_last_line_is_its_result(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def command(arm):
        return [sys.executable, "-c", CHILD, arm]

    out = arms.run_arms(["b", "a"], command)
    assert list(out.items()) == [("b", {"arm": "b", "omp": "1"}), ("a", {"arm": "a", "omp": "1"})]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert arms.run_arms(["c"], command) == {"c": {"arm": "c", "omp": "3"}}


def test_the_first_failing_arm_stops_the_run_with_its_status_and_stderr_tail():
    fail = "import sys; sys.stderr.write('x' * 5000 + 'END'); sys.exit(5)"
    asked = []

    def command(arm):
        asked.append(arm)
        return [sys.executable, "-c", CHILD if arm == "ok" else fail, arm]

    with pytest.raises(arms.ArmFailed, match="arm 'bad' exited with status 5") as info:
        arms.run_arms(["ok", "bad", "never"], command)
    assert asked == ["ok", "bad"]
    err = info.value
    assert (err.arm, err.returncode) == ("bad", 5)
    assert err.stderr_tail == ("x" * 5000 + "END")[-4000:] and len(err.stderr_tail) == arms.STDERR_TAIL_CHARS


@pytest.mark.parametrize(
    ("script", "argv", "arm", "rerun"),
    [
        ("rank_memory", ["--model", "tiny-llama", "--arms", "single"], "single",
         ["--model", "tiny-llama", "--arms", "single", "--arm", "single"]),
        ("lora_agents_memory", ["--model", "tiny-llama", "--arms", "full"], "full",
         ["--child", "full", "--model", "tiny-llama", "--iterations", "2", "--max-new-tokens", "16", "--seed", "0"]),
    ],
)  # fmt: skip
def test_a_benchmark_reruns_itself_per_arm_and_a_failed_arm_is_its_exit_status(
    script, argv, arm, rerun, monkeypatch, capsys
):
    bench = load_script(f"benchmarks/perf/{script}.py")
    commands = []

    def failing(names, command):
        commands.extend(command(a) for a in names)
        raise bench.ArmFailed(arm, 7, "Traceback: boom")

    monkeypatch.setattr(bench, "run_arms", failing)
    assert bench.main(argv) == 7
    assert commands == [[sys.executable, str(ROOT / "benchmarks" / "perf" / f"{script}.py"), *rerun]]
    assert capsys.readouterr().err == "Traceback: boom\n"


def test_rank_memory_prints_the_arms_results_in_its_json(monkeypatch, capsys):
    bench = load_script("benchmarks/perf/rank_memory.py")
    row = {"rank0": {"phases": {"setup": {"rss_mb": 1.0, "peak_mb": 2.0}}, "phase_peaks": True}}
    monkeypatch.setattr(bench, "run_arms", lambda names, command: {a: row for a in names})
    assert bench.main(["--arms", "single"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arms"] == {"single": row} and out["fixes"] is True and out["world"] == 2
