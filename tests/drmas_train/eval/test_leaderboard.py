"""Leaderboard: suites, ranking, refusal of incomparable runs, Markdown/HTML/PNG; the page in headless Chromium."""

from __future__ import annotations

import html.parser
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from drmas_train.eval.leaderboard import LeaderboardError, build_tables, suite_of, to_html, write_leaderboard
from drmas_train.eval.results import load_run, write_run
from helpers.eval_rows import make_episodes, make_summary

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"


def _run(
    tmp_path, name, won, *, env_id="math-solver-verifier-v0", sources=("gsm8k", "math500"), k=2, tasks=4
):
    rows = make_episodes(env_id=env_id, sources=sources, k=k, won=won, tasks=tasks)
    path = write_run(tmp_path / name, make_summary(rows, k, policy=name, label=name), rows)
    return load_run(path, episodes=False)


@pytest.fixture
def runs(tmp_path):
    return [
        _run(tmp_path, "random", lambda t, i: False),
        _run(tmp_path, "oracle", lambda t, i: True),
        _run(tmp_path, "half", lambda t, i: i == 0),  # avg@2 = 0.5, pass@2 = 1
        _run(tmp_path, "gsm-only", lambda t, i: t < 2, sources=("gsm8k",)),  # avg 0.5, missing math500
        _run(tmp_path, "searcher", lambda t, i: t == 0, env_id="search-r1-v0", sources=("nq", "hotpotqa")),
    ]


def test_suite_of():
    assert (
        suite_of("gsm8k") == "math" and suite_of("aime24") == "math" and suite_of("math500/level5") == "math"
    )
    assert suite_of("2wikimultihopqa") == "search" and suite_of("bamboogle") == "search"
    assert suite_of("reasoning_gym/gsm_symbolic") == "other"
    assert suite_of("reasoning_gym/gsm_symbolic", "math-solver-v0") == "math-other"
    assert suite_of("synthetic_encyclopedia", "search-r1-v0") == "search-other"


def test_ranking_and_columns(runs):
    tables = build_tables(runs)
    assert list(tables) == ["math", "search"]
    math_t = tables["math"]
    assert math_t.sources == ["gsm8k", "math500"] and math_t.k == 2
    assert [(r.rank, r.label, r.complete) for r in math_t.rows] == [
        (1, "oracle", True),
        (2, "half", True),
        (3, "random", True),
        (4, "gsm-only", False),  # incomplete rows rank after complete ones
    ]
    assert math_t.rows[1].mean == pytest.approx(0.5)
    assert math_t.rows[1].pass_k("gsm8k") == pytest.approx(1.0)
    assert math_t.rows[3].avg("math500") is None
    assert [r.label for r in tables["search"].rows] == ["searcher"]
    assert tables["search"].sources == ["nq", "hotpotqa"]  # suite order, not alphabetical


def test_ties_share_a_rank(tmp_path):
    tables = build_tables([_run(tmp_path, "a", lambda t, i: True), _run(tmp_path, "b", lambda t, i: True)])
    assert [r.rank for r in tables["math"].rows] == [1, 1]


def test_refuses_different_k(tmp_path):
    runs = [_run(tmp_path, "k2", lambda t, i: True), _run(tmp_path, "k4", lambda t, i: True, k=4)]
    with pytest.raises(
        LeaderboardError, match=r"refusing to rank suite 'math': runs used different k .* \[2, 4\]"
    ):
        build_tables(runs)


def test_refuses_different_env_versions(tmp_path):
    runs = [
        _run(tmp_path, "v0", lambda t, i: True),
        _run(tmp_path, "v1", lambda t, i: True, env_id="math-solver-verifier-v1"),
    ]
    with pytest.raises(
        LeaderboardError, match=r"different versions of env 'math-solver-verifier' \(v0: v0; v1: v1\)"
    ):
        build_tables(runs)
    with pytest.raises(LeaderboardError, match="no runs given"):
        build_tables([])


def test_write_leaderboard_outputs(runs, tmp_path):
    written = write_leaderboard(runs, tmp_path / "lb")
    assert set(written) == {"markdown", "html", "json", "png:math", "png:search"}
    md = written["markdown"].read_text()
    assert "| 1 | oracle | `math-solver-verifier-v0` | 100.0 ± 0.0 | 100.0 ± 0.0 | 100.0 |" in md
    assert "| 4 | gsm-only * | `math-solver-verifier-v0` | 50.0 ± 28.9 | — | 50.0 |" in md
    assert "## search — avg@2" in md
    for key in ("png:math", "png:search"):
        assert written[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = written["html"].read_text()
    assert "http://" not in page and "https://" not in page and "<script src" not in page  # self-contained


class _Rows(html.parser.HTMLParser):
    """Collects (table id, data-label) of every body row, and table attributes."""

    def __init__(self):
        super().__init__()
        self.rows, self.tables, self._table, self.body = [], {}, None, {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id")
            self.tables[self._table] = a
        elif tag == "tr" and "data-label" in a:
            self.rows.append((self._table, a["data-label"]))
        elif tag == "body":
            self.body = a


def _parse(page: str) -> _Rows:
    p = _Rows()
    p.feed(page)
    return p


def test_html_static_rows(runs):
    p = _parse(to_html(build_tables(runs)))
    assert [label for t, label in p.rows if t == "lb-math"] == ["oracle", "half", "random", "gsm-only"]
    assert [label for t, label in p.rows if t == "lb-search"] == ["searcher"]


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-profile-', dir=profile)}",
    ]
    # timeout: a hang guard, never a measurement
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not installed (Debian: apt-get update && apt-get install -y chromium)",
)
@pytest.mark.slow
def test_html_in_headless_chromium(runs, tmp_path):
    written = write_leaderboard(runs, tmp_path / "lb", png=False)
    url = written["html"].resolve().as_uri()
    # 1) default order after the page's JS ran
    dom = _chromium("--dump-dom", url, profile=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    p = _parse(dom.stdout)
    assert p.body.get("data-ready") == "1", "the page's script did not run"
    assert [label for t, label in p.rows if t == "lb-math"] == ["oracle", "half", "random", "gsm-only"]
    # 2) the sort script: ascending by run name, requested through the URL hash
    dom = _chromium("--dump-dom", url + "#sort=lb-math:run:asc", profile=tmp_path)
    p = _parse(dom.stdout)
    assert p.tables["lb-math"].get("data-sorted") == "run:asc"
    assert [label for t, label in p.rows if t == "lb-math"] == ["gsm-only", "half", "oracle", "random"]
    dom = _chromium("--dump-dom", url + "#sort=lb-math:avg:math500:asc", profile=tmp_path)
    p = _parse(dom.stdout)
    assert [label for t, label in p.rows if t == "lb-math"] == ["gsm-only", "random", "half", "oracle"]
    # 3) a screenshot, kept as a test artefact
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "leaderboard.png"
    if shot.exists():
        os.remove(shot)
    res = _chromium(
        "--screenshot=" + str(shot), "--window-size=1400,900", "--hide-scrollbars", url, profile=tmp_path
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000


def test_notes_on_different_task_counts(tmp_path):
    runs = [_run(tmp_path, "a", lambda t, i: True, tasks=4), _run(tmp_path, "b", lambda t, i: True, tasks=3)]
    tables = build_tables(runs)
    assert tables["math"].notes == [
        "gsm8k: runs evaluated different numbers of tasks [3, 4]; compare with care.",
        "math500: runs evaluated different numbers of tasks [3, 4]; compare with care.",
    ]
    written = write_leaderboard(runs, tmp_path / "lb", png=False)
    assert "Note: gsm8k: runs evaluated different numbers of tasks [3, 4]" in written["markdown"].read_text()
    assert '<p class="note">Note: math500' in written["html"].read_text()


def _with_run_metrics(tmp_path, name, won, run_metrics):
    rows = make_episodes(env_id="math-solver-verifier-v0", sources=("gsm8k",), k=2, won=won, tasks=4)
    summary = {**make_summary(rows, 2, policy=name, label=name), "run_metrics": run_metrics}
    return load_run(write_run(tmp_path / name, summary, rows), episodes=False)


def test_run_metrics_get_a_third_table_in_the_ranking_order(tmp_path):
    runs = [
        _with_run_metrics(tmp_path, "worse", lambda t, i: t == 0, {"gain": {"value": 0.0312, "stderr": 0.0204, "n": 3},
                                                                   "wall min": {"value": 612.4, "stderr": None, "n": 1}}),
        _with_run_metrics(tmp_path, "better", lambda t, i: True, {"gain": {"value": 0.4, "stderr": 0.081, "n": 3},
                                                                  "critic": {"value": -1.5, "stderr": 0.25, "n": 3}}),
        _run(tmp_path, "plain", lambda t, i: False, sources=("gsm8k",)),  # no run_metrics: dashes
    ]  # fmt: skip
    table = build_tables(runs)["math"]
    assert table.run_columns == ["gain", "wall min", "critic"]  # first-seen order
    assert [r.label for r in table.rows] == ["better", "worse", "plain"]
    md = write_leaderboard(runs, tmp_path / "lb", png=False)["markdown"].read_text()
    run_table = md.split("### math — run metrics")[1]
    assert "| Rank | Run | Env | gain | wall min | critic |" in run_table
    assert "| 1 | better | `math-solver-verifier-v0` | 0.4 ± 0.081 | — | -1.5 ± 0.25 |" in run_table
    assert "| 2 | worse | `math-solver-verifier-v0` | 0.0312 ± 0.02 | 612 | — |" in run_table
    assert "| 3 | plain | `math-solver-verifier-v0` | — | — | — |" in run_table
    page = to_html(build_tables(runs))
    assert [label for t, label in _parse(page).rows if t == "runs-math"] == ["better", "worse", "plain"]
    assert 'data-key="run:gain"' in page and 'data-value="0.4">0.4 <span class="se">± 0.081</span>' in page
    data = json.loads((tmp_path / "lb" / "leaderboard.json").read_text())["math"]
    assert (
        data["run_columns"] == ["gain", "wall min", "critic"]
        and data["rows"][0]["run_metrics"]["gain"]["value"] == 0.4
    )


def test_no_run_metrics_no_third_table(runs, tmp_path):
    md = write_leaderboard(runs, tmp_path / "lb", png=False)["markdown"].read_text()
    assert "run metrics" not in md and "runs-math" not in to_html(build_tables(runs))


@pytest.mark.parametrize(
    "bad", [{"gain": 0.4}, {"gain": {"value": "high"}}, {"gain": {"value": 1, "stderr": "x"}}, [1]]
)
def test_malformed_run_metrics_are_refused_naming_the_run(tmp_path, bad):
    with pytest.raises(LeaderboardError, match=r"run_metrics"):
        build_tables([_with_run_metrics(tmp_path, "bad", lambda t, i: True, bad)])
