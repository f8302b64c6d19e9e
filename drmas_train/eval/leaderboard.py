"""Leaderboards: many ``drmas eval`` result directories -> one ranked table per benchmark suite.

Outputs (:func:`write_leaderboard`): ``leaderboard.md`` (Markdown), ``leaderboard.html`` (one self-contained page:
inline CSS and JS, sortable columns, no network needed), ``leaderboard_<suite>.png`` (bar chart of avg@k with
standard-error bars) and ``leaderboard.json`` (the tables as data).

Rows are (run, env id) pairs; columns are the suite's data sources. The ranking metric is avg@k (mean accuracy
of one sample), averaged over the suite's data sources the row has; rows missing a data source rank after
complete rows (marked ``*``). Ties share a rank (1, 1, 3). pass@k (unbiased, Chen et al. 2021) is shown in a
second table in the same row order. Runs whose summary carries the optional ``run_metrics`` (named estimates, e.g.
a training benchmark's held-out gain, gradient norms and wall time, mean ± standard error over seeds) get a third
table, again in the same row order, with one column per name.

Ranking is refused (:class:`LeaderboardError`) when runs in one suite used different ``k`` or different
versions of the same env (e.g. ``math-solver-verifier-v0`` vs ``-v1``): their numbers are not comparable.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drmas_train.eval.results import RunResult, env_version

__all__ = ["SUITES", "LeaderboardError", "Row", "Table", "suite_of", "build_tables", "write_leaderboard"]

#: Benchmark suites and their data sources, in display order.
SUITES: dict[str, tuple[str, ...]] = {
    "math": ("gsm8k", "math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench", "math"),
    "search": ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"),
}
OTHER_SUITE = "other"


class LeaderboardError(ValueError):
    """Runs cannot be ranked together (the message says which runs differ, and how)."""


def suite_of(data_source: str, env_id: str | None = None) -> str:
    """The suite a ``data_source`` belongs to: ``"math"`` or ``"search"`` for the known benchmarks (a suffix after
    ``/`` is ignored: ``"math500/level5"`` is math); otherwise ``"<domain>-other"`` where the domain is the first
    word of the env id (``reasoning_gym/gsm_symbolic`` on ``math-solver-v0`` -> ``"math-other"``), or its namespace
    when it has one (``openspiel/kuhn_poker-v0`` -> ``"openspiel-other"``: a suite name is part of a file name, so it
    never holds a ``/``), else ``"other"``.
    """
    base = data_source.split("/", 1)[0].lower()
    for suite, sources in SUITES.items():
        if base in sources:
            return suite
    if env_id:
        domain = env_id.split("/", 1)[0] if "/" in env_id else env_id.split("-", 1)[0]
        return f"{domain.lower()}-{OTHER_SUITE}"
    return OTHER_SUITE


@dataclasses.dataclass
class Row:
    """One (run, env id) line of a suite table.

    Attributes:
        label: display name of the run. env_id: the env evaluated. run_dir: where the results came from.
        k: samples per task. cells: data_source -> metrics cell of the summary (avg@k, pass@k, ...).
        mean: mean avg@k over the suite columns present. complete: whether every column is present.
        rank: 1-based competition rank (set by :func:`build_tables`).
        run_metrics: name -> ``{"value", "stderr", "n"}`` from the summary's optional ``run_metrics``.
    """

    label: str
    env_id: str
    run_dir: str
    k: int
    policy: str
    agent_models: dict[str, str]
    cells: dict[str, dict[str, Any]]
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
    mean: float = 0.0
    complete: bool = True
    rank: int = 0
    run_metrics: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def run_metric(self, name: str) -> tuple[float, float | None] | None:
        """(value, stderr) of the run metric ``name``, or None when the row lacks it."""
        est = self.run_metrics.get(name)
        return None if est is None else (est["value"], est.get("stderr"))

    def avg(self, source: str) -> tuple[float, float | None] | None:
        """(avg@k, stderr) for ``source``, or None when the row lacks it."""
        cell = self.cells.get(source)
        return None if cell is None else (cell["avg@k"]["value"], cell["avg@k"]["stderr"])

    def pass_k(self, source: str) -> float | None:
        """Unbiased pass@k (k = the row's k) for ``source``, or None."""
        cell = self.cells.get(source)
        if cell is None:
            return None
        est = cell.get("pass@k", {}).get(str(self.k))
        return None if est is None else est["value"]


@dataclasses.dataclass
class Table:
    """One suite's ranked table: its columns (data sources), k, rows in rank order, and caveats.

    ``notes`` lists differences that do not block ranking but that a reader must know: a data source evaluated
    on different numbers of tasks, or different sampling parameters. ``run_columns``: the names of the rows'
    ``run_metrics``, in first-seen order of the runs given (empty: no third table).
    """

    suite: str
    k: int
    sources: list[str]
    rows: list[Row]
    notes: list[str] = dataclasses.field(default_factory=list)
    run_columns: list[str] = dataclasses.field(default_factory=list)


def _run_metrics(run: RunResult) -> dict[str, dict[str, Any]]:
    """The summary's optional ``run_metrics``, checked: name -> ``{"value": number, "stderr": number or null, ...}``.

    Raises:
        LeaderboardError: not a mapping of such estimates (names the run and the entry).
    """
    raw = run.summary.get("run_metrics") or {}
    if not isinstance(raw, dict):
        raise LeaderboardError(
            f"{run.path}: 'run_metrics' must map names to estimates, got {type(raw).__name__}"
        )
    for name, est in raw.items():
        ok = (
            isinstance(est, dict)
            and _is_num(est.get("value"))
            and (est.get("stderr") is None or _is_num(est["stderr"]))
        )
        if not ok:
            raise LeaderboardError(f"{run.path}: run_metrics[{name!r}] must be {{'value': number, 'stderr': number "
                                   f"or null, 'n': int}}, got {est!r}")  # fmt: skip
    return dict(raw)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _rows_of(run: RunResult) -> list[Row]:
    summary = run.summary
    k = int(summary["k"])
    extra = _run_metrics(run)
    rows = []
    for env_id, cells in summary["metrics"].items():
        sources = {src: cell for src, cell in cells.items() if src != "overall"}
        rows.append(
            Row(
                label=run.label,
                env_id=env_id,
                run_dir=str(run.path),
                k=k,
                policy=str(summary["policy"]),
                agent_models=dict(summary.get("agent_models") or {}),
                cells=sources,
                sampling=dict(summary.get("sampling") or {}),
                run_metrics=extra,
            )
        )
    return rows


def _check_comparable(suite: str, rows: list[Row]) -> None:
    ks = {r.k for r in rows}
    if len(ks) > 1:
        detail = "; ".join(f"{r.label} [{r.env_id}] k={r.k}" for r in rows)
        raise LeaderboardError(
            f"refusing to rank suite {suite!r}: runs used different k (samples per task) {sorted(ks)}, so their "
            f"avg@k/pass@k are not comparable ({detail}). Re-run 'drmas eval' with the same --k for all."
        )
    versions: dict[str, dict[int, list[str]]] = {}
    for r in rows:
        name = r.env_id.rpartition("-v")[0]
        versions.setdefault(name, {}).setdefault(env_version(r.env_id), []).append(r.label)
    for name, by_version in versions.items():
        if len(by_version) > 1:
            detail = "; ".join(f"v{v}: {', '.join(labels)}" for v, labels in sorted(by_version.items()))
            raise LeaderboardError(
                f"refusing to rank suite {suite!r}: runs used different versions of env {name!r} ({detail}); "
                f"env versions change prompts or rewards, so evaluate every run on the same version."
            )


def _rank(rows: list[Row], sources: list[str]) -> None:
    for r in rows:
        vals = [r.avg(s)[0] for s in sources if r.avg(s) is not None]
        r.mean = sum(vals) / len(vals) if vals else 0.0
        r.complete = len(vals) == len(sources)
    rows.sort(key=lambda r: (not r.complete, -r.mean, r.label, r.env_id))
    prev: tuple[bool, float] | None = None
    for i, r in enumerate(rows, 1):
        key = (r.complete, round(r.mean, 12))
        r.rank = rows[i - 2].rank if key == prev else i
        prev = key


def _notes(rows: list[Row], sources: list[str]) -> list[str]:
    notes = []
    for src in sources:
        counts = sorted({r.cells[src]["num_tasks"] for r in rows if src in r.cells})
        if len(counts) > 1:
            notes.append(f"{src}: runs evaluated different numbers of tasks {counts}; compare with care.")
    llm = [r for r in rows if r.policy == "llm"]
    settings = {json.dumps(r.sampling, sort_keys=True) for r in llm}
    if len(settings) > 1:
        detail = "; ".join(f"{r.label}: {json.dumps(r.sampling, sort_keys=True)}" for r in llm)
        notes.append(f"LLM runs used different sampling parameters ({detail}).")
    return notes


def build_tables(runs: Sequence[RunResult]) -> dict[str, Table]:
    """Group every (run, env, data_source) into suite tables, check comparability and rank.

    Raises:
        LeaderboardError: no runs, or runs in one suite with different k or env versions (says which).
    """
    if not runs:
        raise LeaderboardError("no runs given: pass one or more results directories written by 'drmas eval'")
    per_suite: dict[str, list[Row]] = {}
    for run in runs:
        for row in _rows_of(run):
            by_suite: dict[str, dict[str, dict[str, Any]]] = {}
            for src, cell in row.cells.items():
                by_suite.setdefault(suite_of(src, row.env_id), {})[src] = cell
            for suite, cells in by_suite.items():
                per_suite.setdefault(suite, []).append(dataclasses.replace(row, cells=cells))
    tables = {}
    order = list(SUITES)
    for suite in sorted(per_suite, key=lambda s: (order.index(s) if s in order else len(order), s)):
        rows = per_suite[suite]
        _check_comparable(suite, rows)
        present = {s for r in rows for s in r.cells}
        known = [s for s in SUITES.get(suite, ()) if s in present]
        sources = known + sorted(present - set(known))
        columns = list(dict.fromkeys(name for r in rows for name in r.run_metrics))  # in the runs' order
        _rank(rows, sources)
        tables[suite] = Table(suite, rows[0].k, sources, rows, _notes(rows, sources), columns)
    return tables


# ---------------------------------------------------------------- Markdown


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def _pct_se(v: tuple[float, float | None] | None) -> str:
    if v is None:
        return "—"
    return _pct(v[0]) if v[1] is None else f"{_pct(v[0])} ± {_pct(v[1])}"


def _num(v: tuple[float, float | None] | None) -> str:
    """A run metric as ``value ± stderr`` (3 significant digits, the error 2), or an em dash when absent."""
    if v is None:
        return "—"
    return f"{v[0]:.3g}" if v[1] is None else f"{v[0]:.3g} ± {v[1]:.2g}"


def _models(r: Row) -> str:
    models = ", ".join(f"{a}={m}" for a, m in sorted(r.agent_models.items()))
    return f"policy {r.policy}; {models}; from {r.run_dir}"


def _name(r: Row) -> str:
    return r.label + ("" if r.complete else " *")


def to_markdown(tables: dict[str, Table], title: str = "drmas leaderboard") -> str:
    """The tables as Markdown: per suite an avg@k table (ranked, % ± SE) and a pass@k table (%)."""
    out = [f"# {title}", ""]
    for t in tables.values():
        out += [f"## {t.suite} — avg@{t.k} (%, ± standard error over tasks)", ""]
        head = ["Rank", "Run", "Env", *t.sources, "Mean"]
        out += [
            "| " + " | ".join(head) + " |",
            "|" + "|".join(["---:", "---", "---"] + ["---:"] * (len(head) - 3)) + "|",
        ]
        for r in t.rows:
            cells = [
                str(r.rank),
                _name(r),
                f"`{r.env_id}`",
                *(_pct_se(r.avg(s)) for s in t.sources),
                _pct(r.mean),
            ]
            out.append("| " + " | ".join(cells) + " |")
        out += ["", f"### {t.suite} — pass@{t.k} (%, unbiased estimator)", ""]
        head = ["Rank", "Run", "Env", *t.sources]
        out += [
            "| " + " | ".join(head) + " |",
            "|" + "|".join(["---:", "---", "---"] + ["---:"] * (len(head) - 3)) + "|",
        ]
        for r in t.rows:
            cells = [str(r.rank), _name(r), f"`{r.env_id}`", *(_pct(r.pass_k(s)) for s in t.sources)]
            out.append("| " + " | ".join(cells) + " |")
        if t.run_columns:
            out += [
                "",
                f"### {t.suite} — run metrics (as each run's summary gives them: value ± standard error)",
                "",
            ]
            head = ["Rank", "Run", "Env", *t.run_columns]
            out += [
                "| " + " | ".join(head) + " |",
                "|" + "|".join(["---:", "---", "---"] + ["---:"] * len(t.run_columns)) + "|",
            ]
            for r in t.rows:
                cells = [
                    str(r.rank),
                    _name(r),
                    f"`{r.env_id}`",
                    *(_num(r.run_metric(c)) for c in t.run_columns),
                ]
                out.append("| " + " | ".join(cells) + " |")
        if any(not r.complete for r in t.rows):
            out += [
                "",
                "\\* missing some data sources; ranked after complete rows, mean over the ones present.",
            ]
        for note in t.notes:
            out += ["", f"Note: {note}"]
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------- HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;color:#222}
table{border-collapse:collapse;margin:0 0 2rem}th,td{padding:.35rem .7rem;border-bottom:1px solid #ddd;white-space:nowrap}
th{background:#f4f4f4;cursor:pointer;user-select:none;text-align:left}td.num{text-align:right;
font-variant-numeric:tabular-nums}th[aria-sort=ascending]::after{content:" \\25B2"}
th[aria-sort=descending]::after{content:" \\25BC"}.se{color:#888;font-size:.85em}caption{text-align:left;
font-weight:600;padding:.4rem 0}code{font-size:.9em}
"""

# Sortable tables: click a header to sort (numbers by data-value, text otherwise); a URL hash
# "#sort=<table id>:<column key>:<asc|desc>" sorts on load (used by tests and for shareable links).
_JS = """
(function(){
function val(td){var v=td.getAttribute('data-value');return v===null?td.textContent.trim().toLowerCase():
  (v===''?-Infinity:parseFloat(v));}
function sortBy(table,key,dir){var ths=table.tHead.rows[0].cells,col=-1;for(var i=0;i<ths.length;i++){
  ths[i].removeAttribute('aria-sort');if(ths[i].getAttribute('data-key')===key)col=i;}if(col<0)return false;
  ths[col].setAttribute('aria-sort',dir==='asc'?'ascending':'descending');var body=table.tBodies[0];
  var rows=Array.prototype.slice.call(body.rows);rows.sort(function(a,b){var x=val(a.cells[col]),
  y=val(b.cells[col]);var c=x<y?-1:x>y?1:0;return dir==='asc'?c:-c;});
  rows.forEach(function(r){body.appendChild(r);});table.setAttribute('data-sorted',key+':'+dir);return true;}
var tables=document.querySelectorAll('table.sortable');
tables.forEach(function(table){Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th){
  th.addEventListener('click',function(){var asc=th.getAttribute('aria-sort')!=='ascending';
  sortBy(table,th.getAttribute('data-key'),asc?'asc':'desc');});});});
var m=/sort=([^:&]+):([^&]+):(asc|desc)$/.exec(decodeURIComponent(location.hash||''));
if(m){var t=document.getElementById(m[1]);if(t)sortBy(t,m[2],m[3]);}
document.body.setAttribute('data-ready','1');
})();
"""


def _td(text: str, value: float | None, se: float | None = None) -> str:
    data = "" if value is None else repr(float(value))
    extra = "" if se is None else f' <span class="se">± {_pct(se)}</span>'
    return f'<td class="num" data-value="{data}">{html.escape(text)}{extra}</td>'


def to_html(tables: dict[str, Table], title: str = "drmas leaderboard") -> str:
    """One self-contained HTML page (inline CSS/JS, no external resources) with a sortable table per suite.

    Each table has id ``lb-<suite>``; rows carry ``data-label``/``data-env``; header cells carry ``data-key``
    (``rank``, ``run``, ``env``, ``avg:<source>``, ``pass:<source>``, ``mean``). A suite whose rows have run metrics
    gets a second table, id ``runs-<suite>``, same rows, keys ``rank``, ``run``, ``env``, ``run:<name>``.
    """
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<p>avg@k: mean accuracy of one sample (%, ± standard error over tasks); pass@k: unbiased estimator of "
        "Chen et al. 2021 (%). Click a column header to sort.</p>",
    ]
    for t in tables.values():
        heads = [("rank", "Rank"), ("run", "Run"), ("env", "Env")]
        heads += [(f"avg:{s}", f"{s} avg@{t.k}") for s in t.sources]
        heads += [("mean", "Mean avg@k")]
        heads += [(f"pass:{s}", f"{s} pass@{t.k}") for s in t.sources]
        parts.append(f'<table class="sortable" id="lb-{html.escape(t.suite)}">')
        parts.append(f"<caption>{html.escape(t.suite)} (k = {t.k})</caption><thead><tr>")
        parts += [f'<th data-key="{html.escape(k)}">{html.escape(label)}</th>' for k, label in heads]
        parts.append("</tr></thead><tbody>")
        for r in t.rows:
            cells = [
                _td(str(r.rank), r.rank),
                f'<td title="{html.escape(_models(r))}">{html.escape(_name(r))}</td>',
                f"<td><code>{html.escape(r.env_id)}</code></td>",
            ]
            for s in t.sources:
                v = r.avg(s)
                cells.append(_td(_pct(None if v is None else v[0]), None if v is None else v[0], v and v[1]))
            cells.append(_td(_pct(r.mean), r.mean))
            cells += [_td(_pct(r.pass_k(s)), r.pass_k(s)) for s in t.sources]
            parts.append(
                f'<tr data-label="{html.escape(r.label)}" data-env="{html.escape(r.env_id)}">'
                + "".join(cells)
                + "</tr>"
            )
        parts.append("</tbody></table>")
        if t.run_columns:
            parts.append(_run_metrics_html(t))
        parts += [f'<p class="note">Note: {html.escape(note)}</p>' for note in t.notes]
    parts.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(parts)


def _run_metrics_html(t: Table) -> str:
    """The sortable run-metrics table of a suite (id ``runs-<suite>``), rows in the ranking's order."""
    heads = [("rank", "Rank"), ("run", "Run"), ("env", "Env"), *((f"run:{c}", c) for c in t.run_columns)]
    parts = [f'<table class="sortable" id="runs-{html.escape(t.suite)}">',
             f"<caption>{html.escape(t.suite)}: run metrics (as each run's summary gives them: value ± standard "
             "error)</caption><thead><tr>"]  # fmt: skip
    parts += [f'<th data-key="{html.escape(k)}">{html.escape(label)}</th>' for k, label in heads]
    parts.append("</tr></thead><tbody>")
    for r in t.rows:
        cells = [_td(str(r.rank), r.rank), f'<td title="{html.escape(_models(r))}">{html.escape(_name(r))}</td>',
                 f"<td><code>{html.escape(r.env_id)}</code></td>"]  # fmt: skip
        for c in t.run_columns:
            v = r.run_metric(c)
            se = "" if v is None or v[1] is None else f' <span class="se">± {v[1]:.2g}</span>'
            data = "" if v is None else repr(float(v[0]))
            text = "—" if v is None else f"{v[0]:.3g}"
            cells.append(f'<td class="num" data-value="{data}">{html.escape(text)}{se}</td>')
        parts.append(
            f'<tr data-label="{html.escape(r.label)}" data-env="{html.escape(r.env_id)}">'
            + "".join(cells)
            + "</tr>"
        )
    parts.append("</tbody></table>")
    return "\n".join(parts)


# ---------------------------------------------------------------- PNG


def write_png(table: Table, path: str | Path) -> Path:
    """Bar chart of avg@k (with standard-error bars) per data source, one bar per row, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n_rows, n_src = len(table.rows), len(table.sources)
    width = 0.8 / max(n_rows, 1)
    x = np.arange(n_src)
    many_envs = len({r.env_id for r in table.rows}) > 1
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * n_rows * n_src + 2.5), 4.0), dpi=110)
    for i, r in enumerate(table.rows):
        vals = [r.avg(s) for s in table.sources]
        heights = [0.0 if v is None else 100 * v[0] for v in vals]
        errs = [0.0 if v is None or v[1] is None else 100 * v[1] for v in vals]
        label = f"{r.rank}. {r.label}" + (f" [{r.env_id}]" if many_envs else "")
        bars = ax.bar(x + (i - (n_rows - 1) / 2) * width, heights, width, yerr=errs, capsize=2, label=label)
        ax.bar_label(
            bars, labels=["—" if v is None else f"{100 * v[0]:.0f}" for v in vals], fontsize=7, padding=1
        )
    ax.set_xticks(x, table.sources)
    ax.set_ylabel(f"avg@{table.k} (%)")
    ax.set_ylim(0, 110)
    ax.set_title(f"{table.suite}: avg@{table.k} (± standard error)")
    ax.legend(
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12),
        ncol=2 if n_rows > 3 else 1,
        frameon=False,
    )
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out


def to_json(tables: dict[str, Table]) -> dict[str, Any]:
    """The tables as plain data (suite -> k, sources, run_columns, rows with rank/label/env/mean/cells/run_metrics)."""
    return {
        suite: {
            "k": t.k,
            "sources": t.sources,
            "run_columns": t.run_columns,
            "rows": [
                {
                    "rank": r.rank,
                    "label": r.label,
                    "env_id": r.env_id,
                    "run_dir": r.run_dir,
                    "policy": r.policy,
                    "agent_models": r.agent_models,
                    "complete": r.complete,
                    "mean_avg@k": r.mean,
                    "avg@k": {s: r.avg(s) and r.avg(s)[0] for s in t.sources},
                    "pass@k": {s: r.pass_k(s) for s in t.sources},
                    "run_metrics": r.run_metrics,
                }
                for r in t.rows
            ],
        }
        for suite, t in tables.items()
    }


def write_leaderboard(
    runs: Sequence[RunResult], out_dir: str | Path, *, title: str = "drmas leaderboard", png: bool = True,
    ratings: Sequence[Any] | None = None,
) -> dict[str, Path]:
    """Rank ``runs`` and write Markdown, HTML, JSON and (with ``png``) one PNG per suite into ``out_dir``.

    ``ratings`` (:class:`~drmas_train.eval.ratings.PlayerRating`, from a game's cross-play): the players ranked by
    rating, with their win rate (their avg@k), draw and loss rates and return, as a last section of the Markdown
    and HTML pages and in ``ratings.json``.

    Returns:
        name -> path of every file written (``"markdown"``, ``"html"``, ``"json"``, ``"png:<suite>"``,
        ``"ratings"``).

    Raises:
        LeaderboardError: see :func:`build_tables`.
    """
    from drmas_train.eval.ratings import ratings_html, ratings_markdown

    tables = build_tables(runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {
        "markdown": out / "leaderboard.md",
        "html": out / "leaderboard.html",
        "json": out / "leaderboard.json",
    }
    page = to_html(tables, title)
    markdown = to_markdown(tables, title)
    if ratings:
        markdown += "\n" + ratings_markdown(ratings)
        page = page.replace("<script>", ratings_html(ratings) + "\n<script>", 1)
        written["ratings"] = out / "ratings.json"
        written["ratings"].write_text(json.dumps([r.to_dict() for r in ratings], indent=2) + "\n", encoding="utf-8")
    written["markdown"].write_text(markdown, encoding="utf-8")
    written["html"].write_text(page, encoding="utf-8")
    written["json"].write_text(json.dumps(to_json(tables), indent=2) + "\n", encoding="utf-8")
    if png:
        for suite, t in tables.items():
            written[f"png:{suite}"] = write_png(t, out / f"leaderboard_{suite}.png")
    return written
