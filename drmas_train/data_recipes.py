"""The paper's data, built from files a user downloads: ``drmas data prepare <recipe>``.

Each :class:`Recipe` rebuilds one of the Dr. MAS reference's data sets from the raw files its preprocessing script
downloads, without network access here (no Hugging Face Hub calls: the user fetches the files; every missing one is
named with the command that fetches it):

==================  ==========================================================  ===================================
recipe              reference                                                   writes (``--out``)
==================  ==========================================================  ===================================
``drmas_math``      langfengQ/DrMAS ``examples/data_preprocess/drmas_math.py``  ``train.jsonl`` (DAPO-filtered),
                                                                                ``test.jsonl`` (MATH-500, AIME24,
                                                                                AIME25, OlympiadBench, AMC23,
                                                                                Minerva), ``test_sampled.jsonl``
``drmas_search``    ``examples/data_preprocess/drmas_search.py``                ``train.jsonl`` (NQ + HotpotQA),
                                                                                ``test.jsonl`` (the seven QA sets),
                                                                                ``test_sampled.jsonl``
``wiki18``          ``examples/search/searchr1_download.py`` + README steps     ``wiki-18.jsonl``, ``e5_Flat.index``
==================  ==========================================================  ===================================

Task files are drmas ``tasks`` JSONL (:meth:`drmas_envs.core.Task.to_dict` rows, one per line, each with its
``data_source`` tag), read back by :func:`drmas_envs.data.load_tasks` and the search envs' ``tasks=``.

Checksums: the reference and its sources pin no file hashes, so ``prepare`` records the SHA-256, size and row
count of every input and output in ``MANIFEST.json``; ``drmas data verify <out>`` re-hashes the outputs (and the
inputs, if still present) against it. An input whose :attr:`RecipeInput.sha256` is set is checked before use.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from drmas_envs.core import Task

__all__ = [
    "DataPrepError",
    "MissingInputError",
    "ChecksumError",
    "RecipeInput",
    "Recipe",
    "RECIPES",
    "get_recipe",
    "find_input",
    "prepare",
    "verify",
    "sha256_file",
    "MANIFEST",
    "missing_data_hint",
]

#: name of the manifest written next to the prepared files.
MANIFEST = "MANIFEST.json"
_SUFFIXES = (".parquet", ".jsonl", ".json")
_CHUNK = 1 << 20


class DataPrepError(ValueError):
    """A recipe cannot run: unknown recipe, malformed rows, an existing output, ... (the message says what to do)."""


class MissingInputError(DataPrepError):
    """A raw input file is missing; the message names the file and the command that fetches it."""


class ChecksumError(DataPrepError):
    """A file's SHA-256 differs from the pinned or recorded one."""


@dataclasses.dataclass(frozen=True)
class RecipeInput:
    """One raw file a recipe reads.

    Attributes:
        name: short name (``"aime24"``), also the ``data_source`` tag of its tasks unless the rows carry their own.
        stem: path under the raw directory without suffix (``"aime24"``, ``"nq_hotpotqa_train/test"``); the first
            of ``stem + s`` for s in ``suffixes`` that exists is read.
        origin: where the file comes from (dataset id and split), for messages and the manifest.
        fetch: a shell command that writes the file; ``{raw}`` stands for the raw directory.
        suffixes: accepted file suffixes, in order of preference.
        sha256: the expected SHA-256 when the source pins it (None: recorded, not checked).
    """

    name: str
    stem: str
    origin: str
    fetch: str
    suffixes: tuple[str, ...] = _SUFFIXES
    sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A data set of the reference, rebuilt from raw files.

    Attributes:
        name: recipe name (``drmas data prepare <name>``).
        description: one line.
        reference: the reference file it reproduces.
        inputs: the raw files.
        build: ``(input paths by name, out dir) -> {output file name: row count}``; writes the outputs into the
            (temporary) out dir and raises :class:`DataPrepError` for bad rows.
        outputs: the file names ``build`` writes.
        next_steps: printed after a successful run (``{out}`` = the output directory).
    """

    name: str
    description: str
    reference: str
    inputs: tuple[RecipeInput, ...]
    build: Callable[[dict[str, Path], Path], dict[str, int]]
    outputs: tuple[str, ...]
    next_steps: str = ""


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (works for multi-GB indexes)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_input(spec: RecipeInput, raw: Path) -> Path:
    """The file of ``spec`` under ``raw``.

    Raises:
        MissingInputError: none of the accepted names exists; names the expected path and the fetch command.
    """
    for suffix in spec.suffixes:
        path = raw / f"{spec.stem}{suffix}"
        if path.is_file():
            return path
    names = " or ".join(f"{spec.stem}{s}" for s in spec.suffixes)
    raise MissingInputError(
        f"missing input {spec.name!r}: expected {raw / names} ({spec.origin}). Fetch it with:\n"
        f"  {spec.fetch.format(raw=raw)}"
    )


# ---------------------------------------------------------------- rows -> tasks


def _rows(path: Path) -> list[tuple[str, Mapping[str, Any]]]:
    from drmas_envs.data.files import read_rows

    return list(read_rows(path))


def _field(row: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in row or row[key] is None:
        raise DataPrepError(f"{where}: missing field {key!r} (fields: {sorted(row)})")
    return row[key]


#: the instruction the reference strips from DAPO prompts (drmas_math.py:36-39).
_DAPO_SUFFIX = re.compile(
    r"(\r?\n|\\n)*\s*Let'?s\s+think\s+step\s+by\s+step\s+and\s+output\s+the\s+final\s+answer\s+within\s*\\boxed\{\}\.\s*$",
    re.IGNORECASE,
)


def dapo_task(row: Mapping[str, Any], index: int, where: str, data_source: str = "dapo_filter") -> Task:
    """A DAPO-filtered training row (``prompt`` = one user message, ``reward_model.ground_truth``) as a Task, the
    question stripped of its "Let's think step by step ..." suffix as the reference (drmas_math.py:40-66).

    Raises:
        DataPrepError: missing fields or a prompt that is not exactly one message.
    """
    prompt = _field(row, "prompt", where)
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)) or len(prompt) != 1 or not isinstance(prompt[0], Mapping):
        raise DataPrepError(f"{where}: field 'prompt' must be a list of exactly one chat message, got {prompt!r:.200}")
    reward_model = _field(row, "reward_model", where)
    if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
        raise DataPrepError(f"{where}: field 'reward_model' must hold a 'ground_truth'")
    question = _DAPO_SUFFIX.sub("", str(prompt[0].get("content", "")))
    if not question.strip():
        raise DataPrepError(f"{where}: empty question")
    extra = {"split": "train", "index": index, "ability": row.get("ability")}
    return Task(f"{data_source}-{index}", data_source, question, str(reward_model["ground_truth"]), extra)


def problem_task(row: Mapping[str, Any], index: int, where: str, data_source: str) -> Task:
    """A math test row (``problem``, ``answer``; a numeric answer becomes its str) as a Task (drmas_math.py:72-99).

    Raises:
        DataPrepError: missing ``problem`` or ``answer``.
    """
    question = str(_field(row, "problem", where))
    answer = _field(row, "answer", where)
    return Task(f"{data_source}-{index}", data_source, question, str(answer), {"split": "test", "index": index})


def _math_inputs() -> tuple[RecipeInput, ...]:
    def hf(dataset: str, split: str, stem: str) -> str:
        return (f"python -c \"import datasets; datasets.load_dataset('{dataset}', split='{split}')"
                f".to_parquet('{{raw}}/{stem}.parquet')\"")  # fmt: skip

    rows = [  # name, HF dataset, split (drmas_math.py:19-27)
        ("dapo_filter", "aaabiao/dapo_filter", "train"),
        ("aime24", "HuggingFaceH4/aime_2024", "train"),
        ("aime25", "MathArena/aime_2025", "train"),
        ("math500", "HuggingFaceH4/MATH-500", "test"),
        ("amc23", "knoveleng/AMC-23", "train"),
        ("minerva", "zwhe99/simplerl-minerva-math", "test"),
        ("olympiadbench", "realtreetune/olympiadbench", "test"),
    ]
    return tuple(
        RecipeInput(name, f"{name}_{split}", f"HF dataset {ds}, split {split}", hf(ds, split, f"{name}_{split}"))
        for name, ds, split in rows
    )


def _write_tasks(path: Path, tasks: Sequence[Task], *, with_id: bool = False) -> int:
    with path.open("w", encoding="utf-8") as handle:
        for task in tasks:
            row = task.to_dict()
            if with_id:  # the search envs' QA loader reads the task id from "id"
                row["id"] = task.task_id
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(tasks)


def _build_math(paths: dict[str, Path], out: Path) -> dict[str, int]:
    """drmas_math.py:103-123: train = DAPO-filtered; test = MATH-500, AIME24, AIME25, OlympiadBench, AMC23, Minerva
    (in that order); test_sampled = the first 50 MATH-500 problems (tag ``math500_first50``), AIME24, AIME25."""
    train = [dapo_task(row, i, where) for i, (where, row) in enumerate(_rows(paths["dapo_filter"]))]
    tests = {
        name: [problem_task(row, i, where, name) for i, (where, row) in enumerate(_rows(paths[name]))]
        for name in ("math500", "aime24", "aime25", "olympiadbench", "amc23", "minerva")
    }
    first50 = [problem_task(row, i, where, "math500_first50") for i, (where, row) in enumerate(_rows(paths["math500"])[:50])]
    counts = {"train.jsonl": _write_tasks(out / "train.jsonl", train)}
    counts["test.jsonl"] = _write_tasks(out / "test.jsonl", [t for ts in tests.values() for t in ts])
    counts["test_sampled.jsonl"] = _write_tasks(out / "test_sampled.jsonl", first50 + tests["aime24"] + tests["aime25"])
    return counts


#: Search-R1's seven test sets (the reference's test.parquet), and the two training sets.
SEARCH_TEST_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
SEARCH_TRAIN_SOURCES = ("nq", "hotpotqa")


def _qa_tasks(path: Path, split: str) -> list[Task]:
    from drmas_envs.search.data import row_to_task

    tasks = []
    for i, (where, row) in enumerate(_rows(path)):
        if not isinstance(row.get("data_source"), str) or not row["data_source"]:
            raise DataPrepError(f"{where}: missing field 'data_source' (Search-R1 rows carry their dataset tag)")
        try:
            task = row_to_task(row, index=i, where=where)
        except ValueError as err:
            raise DataPrepError(str(err)) from err
        tasks.append(dataclasses.replace(task, extra={**task.extra, "split": split, "index": i}))
    return tasks


def _check_sources(tasks: Sequence[Task], expected: Sequence[str], path: Path, what: str) -> None:
    present = {t.data_source for t in tasks}
    missing = [s for s in expected if s not in present]
    unknown = sorted(present - set(expected))
    if missing or unknown:
        raise DataPrepError(
            f"{path}: not the reference's {what}: data_source tags missing {missing}, unexpected {unknown} "
            f"(expected exactly {list(expected)})"
        )


def _build_search(paths: dict[str, Path], out: Path) -> dict[str, int]:
    """drmas_search.py:115-160: train/test of Search-R1's nq_hotpotqa_train; test_sampled = the first 30 rows of each
    data_source, sources in order of first appearance (``sample_by_data_source``, drmas_search.py:90-113)."""
    train = _qa_tasks(paths["train"], "train")
    _check_sources(train, SEARCH_TRAIN_SOURCES, paths["train"], "training set (NQ + HotpotQA)")
    test = _qa_tasks(paths["test"], "test")
    _check_sources(test, SEARCH_TEST_SOURCES, paths["test"], "test set (seven QA benchmarks)")
    taken: Counter[str] = Counter()
    order = list(dict.fromkeys(t.data_source for t in test))
    sampled = []
    for source in order:
        for task in test:
            if task.data_source == source and taken[source] < 30:
                sampled.append(task)
                taken[source] += 1
    return {
        "train.jsonl": _write_tasks(out / "train.jsonl", train, with_id=True),
        "test.jsonl": _write_tasks(out / "test.jsonl", test, with_id=True),
        "test_sampled.jsonl": _write_tasks(out / "test_sampled.jsonl", sampled, with_id=True),
    }


def _build_wiki18(paths: dict[str, Path], out: Path) -> dict[str, int]:
    """The reference README's two steps: ``gzip -d wiki-18.jsonl.gz`` and ``cat part_* > e5_Flat.index``."""
    rows = 0
    with gzip.open(paths["corpus"], "rb") as src, (out / "wiki-18.jsonl").open("wb") as dst:
        for line in src:
            dst.write(line)
            rows += bool(line.strip())
    with (out / "e5_Flat.index").open("wb") as dst:
        for part in ("index_part_aa", "index_part_ab"):
            with paths[part].open("rb") as src:
                shutil.copyfileobj(src, dst, _CHUNK)
    return {"wiki-18.jsonl": rows, "e5_Flat.index": 0}


_HF_FILE = "huggingface-cli download {repo} {file} --repo-type dataset --local-dir {{raw}}/{dir}"

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "drmas_math",
            "Dr. MAS math: DAPO-filtered train set; MATH-500, AIME24/25, AMC23, Minerva, OlympiadBench tests",
            "langfengQ/DrMAS examples/data_preprocess/drmas_math.py",
            _math_inputs(),
            _build_math,
            ("train.jsonl", "test.jsonl", "test_sampled.jsonl"),
            "train with: drmas train --config drmas_math_qwen3_4b env.data={out}/train.jsonl "
            "eval.data={out}/test_sampled.jsonl",
        ),
        Recipe(
            "drmas_search",
            "Dr. MAS search: Search-R1 NQ + HotpotQA train set; NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle tests",
            "langfengQ/DrMAS examples/data_preprocess/drmas_search.py",
            tuple(
                RecipeInput(split, f"nq_hotpotqa_train/{split}", f"HF dataset PeterJinGo/nq_hotpotqa_train, file {split}.parquet",
                            _HF_FILE.format(repo="PeterJinGo/nq_hotpotqa_train", file=f"{split}.parquet", dir="nq_hotpotqa_train"))
                for split in ("train", "test")
            ),  # fmt: skip
            _build_search,
            ("train.jsonl", "test.jsonl", "test_sampled.jsonl"),
            "train with: drmas train --config drmas_search_qwen25_3b env.kwargs.tasks={out}/train.jsonl "
            "eval.data={out}/test_sampled.jsonl  (needs a retrieval server: drmas data prepare wiki18)",
        ),
        Recipe(
            "wiki18",
            "wiki-18 corpus (21M passages) and its e5 flat FAISS index, as Search-R1 / the reference serve them",
            "langfengQ/DrMAS examples/search/searchr1_download.py and README 'Download the index'",
            (
                RecipeInput("corpus", "searchR1/wiki-18", "HF dataset PeterJinGo/wiki-18-corpus, file wiki-18.jsonl.gz",
                            _HF_FILE.format(repo="PeterJinGo/wiki-18-corpus", file="wiki-18.jsonl.gz", dir="searchR1"),
                            suffixes=(".jsonl.gz",)),
                RecipeInput("index_part_aa", "searchR1/part_aa", "HF dataset PeterJinGo/wiki-18-e5-index, file part_aa",
                            _HF_FILE.format(repo="PeterJinGo/wiki-18-e5-index", file="part_aa", dir="searchR1"), suffixes=("",)),
                RecipeInput("index_part_ab", "searchR1/part_ab", "HF dataset PeterJinGo/wiki-18-e5-index, file part_ab",
                            _HF_FILE.format(repo="PeterJinGo/wiki-18-e5-index", file="part_ab", dir="searchR1"), suffixes=("",)),
            ),  # fmt: skip
            _build_wiki18,
            ("wiki-18.jsonl", "e5_Flat.index"),
            "serve it on port 8000 as the reference (examples/search/retriever/retrieval_launch.sh):\n"
            "  python examples/search/retriever/retrieval_server.py --index_path {out}/e5_Flat.index "
            "--corpus_path {out}/wiki-18.jsonl --topk 3 --retriever_name e5 --retriever_model intfloat/e5-base-v2 "
            "--faiss_gpu --port 8000\n"
            "or build drmas's own dense index over the same corpus (no FAISS; slow on CPU):\n"
            "  drmas retrieval-server --corpus {out}/wiki-18.jsonl --retriever dense --model intfloat/e5-base-v2 --port 8000",
        ),
    )
}


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``.

    Raises:
        DataPrepError: unknown name; lists the recipes and suggests the closest.
    """
    if name in RECIPES:
        return RECIPES[name]
    import difflib

    close = difflib.get_close_matches(name, RECIPES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise DataPrepError(f"unknown data recipe {name!r}; recipes: {sorted(RECIPES)}.{hint}")


def _source_counts(path: Path) -> dict[str, int] | None:
    if not path.name.endswith(".jsonl") or path.name == "wiki-18.jsonl":
        return None
    counts: Counter[str] = Counter()
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                counts[json.loads(line)["data_source"]] += 1
    return dict(counts)


def prepare(recipe: Recipe | str, raw: str | Path, out: str | Path, *, force: bool = False) -> dict[str, Any]:
    """Build ``recipe``'s files from the raw files under ``raw`` into ``out`` and write ``out/MANIFEST.json``.

    Every input is located (and its pinned SHA-256 checked) before anything is written; outputs are built in a
    temporary directory next to ``out`` and moved in only when all succeeded.

    Args:
        recipe: a :class:`Recipe` or a name in :data:`RECIPES`.
        raw: directory holding the downloaded files (see :attr:`RecipeInput.stem`).
        out: output directory (created).
        force: replace outputs of an earlier run; without it an existing output or manifest is an error.

    Returns:
        The manifest: ``recipe``, ``reference``, ``created``, ``inputs`` (name -> path, sha256, bytes) and
        ``outputs`` (file -> sha256, bytes, rows, data_sources).

    Raises:
        MissingInputError: raw files are missing (the message names each and how to fetch it).
        ChecksumError: a pinned input hash differs.
        DataPrepError: unknown recipe, malformed rows, or existing outputs without ``force``.
    """
    recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
    raw, out = Path(raw), Path(out)
    paths, missing = {}, []
    for spec in recipe.inputs:  # every missing file is named at once, before anything is read or written
        try:
            paths[spec.name] = find_input(spec, raw)
        except MissingInputError as err:
            missing.append(str(err))
    if missing:
        raise MissingInputError(f"{len(missing)} of {len(recipe.inputs)} input file(s) of {recipe.name!r} missing:\n" + "\n".join(missing))
    existing = [name for name in (*recipe.outputs, MANIFEST) if (out / name).exists()]
    if existing and not force:
        raise DataPrepError(f"{out} already holds {existing}; pass --force to replace them (or choose another --out)")
    inputs = {}
    for spec in recipe.inputs:
        digest = sha256_file(paths[spec.name])
        if spec.sha256 is not None and digest != spec.sha256:
            raise ChecksumError(
                f"input {spec.name!r} at {paths[spec.name]} has SHA-256 {digest}, expected {spec.sha256} "
                f"({spec.origin}); fetch it again with:\n  {spec.fetch.format(raw=raw)}"
            )
        inputs[spec.name] = {"path": str(paths[spec.name]), "origin": spec.origin, "sha256": digest,
                             "bytes": paths[spec.name].stat().st_size, "pinned": spec.sha256 is not None}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".prepare-") as tmp:
        rows = recipe.build(paths, Path(tmp))
        outputs = {}
        for name in recipe.outputs:
            built = Path(tmp) / name
            outputs[name] = {"sha256": sha256_file(built), "bytes": built.stat().st_size, "rows": rows.get(name, 0)}
            sources = _source_counts(built)
            if sources is not None:
                outputs[name]["data_sources"] = sources
        for name in recipe.outputs:
            os.replace(Path(tmp) / name, out / name)
    manifest = {"recipe": recipe.name, "reference": recipe.reference,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "inputs": inputs, "outputs": outputs}  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def verify(out: str | Path, *, check_inputs: bool = True) -> list[str]:
    """Re-hash the files recorded in ``out/MANIFEST.json``.

    Args:
        out: a directory written by :func:`prepare`.
        check_inputs: also re-hash the recorded inputs that still exist (missing inputs are not an error: raw
            downloads may have been deleted after preparing).

    Returns:
        One line per problem (a missing or changed output, a changed input); empty when all match.

    Raises:
        DataPrepError: no manifest in ``out``.
    """
    out = Path(out)
    if not (out / MANIFEST).is_file():
        raise DataPrepError(f"{out / MANIFEST} not found: {out} was not written by 'drmas data prepare'")
    manifest = json.loads((out / MANIFEST).read_text())
    problems = []
    for name, rec in manifest["outputs"].items():
        path = out / name
        if not path.is_file():
            problems.append(f"output {path} is missing")
        elif (digest := sha256_file(path)) != rec["sha256"]:
            problems.append(f"output {path} has SHA-256 {digest}, recorded {rec['sha256']}")
    if check_inputs:
        for name, rec in manifest["inputs"].items():
            path = Path(rec["path"])
            if path.is_file() and (digest := sha256_file(path)) != rec["sha256"]:
                problems.append(f"input {name!r} at {path} has SHA-256 {digest}, recorded {rec['sha256']}")
    return problems


def missing_data_hint(path: str | Path) -> str:
    """For a task/corpus path that does not exist: the ``drmas data prepare`` command that writes it, if any."""
    p = Path(path)
    for recipe in RECIPES.values():
        if p.name in recipe.outputs and p.parent.name == recipe.name:
            return f"; it is written by: drmas data prepare {recipe.name} --out {p.parent} (see: drmas data list)"
    for recipe in RECIPES.values():
        if p.name in recipe.outputs:
            return f"; if it is {recipe.name!r} data: drmas data prepare {recipe.name} --out {p.parent} (see: drmas data list)"
    return ""


def require_task_files(cfg: Any) -> None:
    """Check that the task files a :class:`~drmas_train.config.TrainConfig` names exist (``env.data``,
    ``env.kwargs.tasks``, and ``eval.data`` when evaluating), before anything loads.

    Raises:
        drmas_train.config.ConfigError: naming the key, the path and, for a recipe's output, the
            ``drmas data prepare`` command that writes it.
    """
    from drmas_train.config import ConfigError

    keys = (("env.data", cfg.env.data), ("env.kwargs.tasks", cfg.env.kwargs.get("tasks")),
            ("eval.data", cfg.eval.data if cfg.eval.every > 0 else None))  # fmt: skip
    for key, spec in keys:
        if isinstance(spec, str) and spec.endswith(_SUFFIXES) and not Path(spec).is_file():
            raise ConfigError(f"{key}: task file {spec!r} not found{missing_data_hint(spec)}")
