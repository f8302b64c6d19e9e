"""``drmas data prepare``: the reference's data sets rebuilt from downloaded files (fixtures made here; real
../shared/data files where present), checksums recorded and verified, clear errors for missing files."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drmas_envs.data.load import load_tasks
from drmas_train.commands.data import main as data_main
from drmas_train.data.prepare import prepare, verify
from drmas_train.data.recipe import ChecksumError, DataPrepError
from drmas_train.data.recipes import RECIPES
from helpers.shared_data import SHARED_DATA, shared_file

DAPO_SUFFIX = "\n\nLet's think step by step and output the final answer within \\boxed{}."


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _math_raw(raw: Path, math500: Path | None = None) -> None:
    """Tiny stand-ins of the seven downloads (HF column layouts as drmas_math.py reads them)."""
    raw.mkdir(parents=True, exist_ok=True)
    dapo = pa.table({
        "prompt": [[{"role": "user", "content": f"What is {i} + {i}?{DAPO_SUFFIX}"}] for i in range(3)],
        "reward_model": [{"style": "rule", "ground_truth": str(2 * i)} for i in range(3)],
        "ability": ["MATH"] * 3,
        "data_source": ["math_dapo"] * 3,
    })  # fmt: skip
    pq.write_table(dapo, raw / "dapo_filter_train.parquet")
    for name, n in (("aime24_train", 2), ("aime25_train", 3), ("amc23_train", 2), ("minerva_test", 1), ("olympiadbench_test", 2)):
        _jsonl(raw / f"{name}.jsonl", [{"problem": f"{name} problem {i}", "answer": 100 + i} for i in range(n)])
    if math500 is None:
        _jsonl(raw / "math500_test.jsonl", [{"problem": f"m{i}", "answer": f"\\frac{{{i}}}{{2}}"} for i in range(60)])
    else:
        (raw / "math500_test.jsonl").write_bytes(math500.read_bytes())


def test_math_recipe_builds_reference_splits_with_tags_and_manifest(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "data" / "drmas_math"
    _math_raw(raw)
    manifest = prepare("drmas_math", raw, out)
    train = _read(out / "train.jsonl")
    assert [t["question"] for t in train] == ["What is 0 + 0?", "What is 1 + 1?", "What is 2 + 2?"]  # suffix stripped
    assert [t["answer"] for t in train] == ["0", "2", "4"] and {t["data_source"] for t in train} == {"dapo_filter"}
    test = _read(out / "test.jsonl")
    order = list(dict.fromkeys(t["data_source"] for t in test))  # drmas_math.py:118 order
    assert order == ["math500", "aime24", "aime25", "olympiadbench", "amc23", "minerva"]
    assert len(test) == 60 + 2 + 3 + 2 + 2 + 1
    assert test[60] == {"task_id": "aime24-0", "data_source": "aime24", "question": "aime24_train problem 0", "answer": "100",
                        "extra": {"split": "test", "index": 0}}  # fmt: skip
    sampled = _read(out / "test_sampled.jsonl")
    assert [t["data_source"] for t in sampled] == ["math500_first50"] * 50 + ["aime24"] * 2 + ["aime25"] * 3
    assert manifest["outputs"]["test.jsonl"]["data_sources"] == {"math500": 60, "aime24": 2, "aime25": 3, "olympiadbench": 2,
                                                                  "amc23": 2, "minerva": 1}  # fmt: skip
    for name, rec in manifest["outputs"].items():
        assert rec["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    dapo = raw / "dapo_filter_train.parquet"
    assert manifest["inputs"]["dapo_filter"] == {"path": str(dapo), "origin": "HF dataset aaabiao/dapo_filter, split train",
                                                 "sha256": hashlib.sha256(dapo.read_bytes()).hexdigest(),
                                                 "bytes": dapo.stat().st_size, "pinned": False}  # fmt: skip
    assert json.loads((out / "MANIFEST.json").read_text()) == manifest
    tasks = load_tasks(str(out / "test_sampled.jsonl"))  # what the presets' eval.data reads
    assert len(tasks) == 55 and tasks[0].data_source == "math500_first50" and tasks[0].answer == "\\frac{0}{2}"
    assert verify(out) == []


def test_math_recipe_on_the_real_math500_file(tmp_path):
    math500 = shared_file("math500_test.jsonl")
    raw, out = tmp_path / "raw", tmp_path / "out"
    _math_raw(raw, math500=math500)
    prepare("drmas_math", raw, out)
    rows = [json.loads(line) for line in math500.read_text().splitlines()]
    test = [t for t in _read(out / "test.jsonl") if t["data_source"] == "math500"]
    assert len(test) == 500 and [t["answer"] for t in test] == [r["answer"] for r in rows]
    assert test[0]["question"] == rows[0]["problem"]
    assert sum(t["data_source"] == "math500_first50" for t in _read(out / "test_sampled.jsonl")) == 50


def test_missing_inputs_are_named_with_their_fetch_command(tmp_path, capsys):
    raw = tmp_path / "raw"
    _math_raw(raw)
    (raw / "aime25_train.jsonl").unlink()
    (raw / "dapo_filter_train.parquet").unlink()
    assert data_main(["prepare", "drmas_math", "--raw", str(raw), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drmas data: 2 of 7 input file(s) of 'drmas_math' missing:\n")
    assert f"missing input 'aime25': expected {raw}/aime25_train.parquet or aime25_train.jsonl or aime25_train.json" in err
    assert (f"python -c \"import datasets; datasets.load_dataset('aaabiao/dapo_filter', split='train')"
            f".to_parquet('{raw}/dapo_filter_train.parquet')\"") in err  # fmt: skip
    assert not (tmp_path / "out").exists()  # nothing written


def test_existing_outputs_need_force_and_verify_catches_changes(tmp_path, capsys):
    raw, out = tmp_path / "raw", tmp_path / "out"
    _math_raw(raw)
    args = ["prepare", "drmas_math", "--raw", str(raw), "--out", str(out)]
    assert data_main(args) == 0
    printed = capsys.readouterr().out
    assert f"{out}/test.jsonl: 70 rows" in printed and "drmas train --config drmas_math_qwen3_4b" in printed
    assert data_main(args) == 2
    assert "already holds ['train.jsonl', 'test.jsonl', 'test_sampled.jsonl', 'MANIFEST.json']; pass --force" in capsys.readouterr().err
    assert data_main([*args, "--force"]) == 0
    assert data_main(["verify", str(out)]) == 0
    with (out / "test.jsonl").open("a") as handle:
        handle.write("\n")
    (raw / "aime24_train.jsonl").write_text('{"problem": "changed", "answer": 1}\n')
    capsys.readouterr()
    assert data_main(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"output {out}/test.jsonl has SHA-256 " in err and "input 'aime24' at " in err
    assert data_main(["verify", str(out), "--outputs-only"]) == 1
    assert "input 'aime24'" not in capsys.readouterr().err
    assert data_main(["verify", str(raw)]) == 2
    assert "MANIFEST.json not found" in capsys.readouterr().err


def test_pinned_checksum_is_enforced(tmp_path):
    raw = tmp_path / "raw"
    _math_raw(raw)
    recipe = RECIPES["drmas_math"]
    good = hashlib.sha256((raw / "aime24_train.jsonl").read_bytes()).hexdigest()
    pin = lambda sha: dataclasses.replace(recipe, inputs=tuple(  # noqa: E731
        dataclasses.replace(i, sha256=sha) if i.name == "aime24" else i for i in recipe.inputs))  # fmt: skip
    with pytest.raises(ChecksumError, match=r"input 'aime24' at .*aime24_train.jsonl has SHA-256 [0-9a-f]{64}, expected 0{64}"):
        prepare(pin("0" * 64), raw, tmp_path / "bad")
    assert not (tmp_path / "bad" / "MANIFEST.json").exists()
    assert prepare(pin(good), raw, tmp_path / "ok")["inputs"]["aime24"]["pinned"] is True


def test_bad_rows_and_unknown_recipe(tmp_path, capsys):
    raw = tmp_path / "raw"
    _math_raw(raw)
    _jsonl(raw / "minerva_test.jsonl", [{"problem": "p"}])
    with pytest.raises(DataPrepError, match=r"minerva_test.jsonl:1: missing field 'answer' \(fields: \['problem'\]\)"):
        prepare("drmas_math", raw, tmp_path / "out")
    assert data_main(["prepare", "drmas_maths"]) == 2
    assert "unknown data recipe 'drmas_maths'; recipes: ['drmas_math', 'drmas_search', 'wiki18']. Did you mean 'drmas_math'?" in capsys.readouterr().err


def _search_row(source: str, i: int, question: str | None = None, answers: list[str] | None = None) -> dict:
    answers = answers or [f"{source} answer {i}"]
    return {"id": f"{source}_{i}", "question": question or f"{source} question {i}?", "golden_answers": answers,
            "data_source": source, "prompt": [{"role": "user", "content": "..."}], "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": answers}}, "metadata": None}  # fmt: skip


def _search_raw(raw: Path, nq_rows: list[dict] | None = None) -> None:
    d = raw / "nq_hotpotqa_train"
    _jsonl(d / "train.jsonl", [_search_row("nq", i) for i in range(3)] + [_search_row("hotpotqa", i) for i in range(2)])
    test = nq_rows or [_search_row("nq", i) for i in range(35)]
    for source in ("triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"):
        test += [_search_row(source, i) for i in range(2)]
    _jsonl(d / "test.jsonl", test)


def test_search_recipe_samples_30_per_source_and_feeds_the_search_env(tmp_path):
    nq, nq_rows = SHARED_DATA / "nq_test_1000.jsonl", None
    if nq.is_file():  # real NQ questions and golden answers (FlashRAG file) in the Search-R1 row layout
        nq_rows = [_search_row("nq", i, r["question"], r["golden_answers"]) for i, r in enumerate(_read(nq)[:40])]
    raw, out = tmp_path / "raw", tmp_path / "out"
    _search_raw(raw, nq_rows)
    manifest = prepare("drmas_search", raw, out)
    n_nq = 40 if nq_rows else 35
    assert manifest["outputs"]["test.jsonl"]["data_sources"] == {"nq": n_nq, **{s: 2 for s in ("triviaqa", "popqa", "hotpotqa",
                                                                  "2wikimultihopqa", "musique", "bamboogle")}}  # fmt: skip
    sampled = _read(out / "test_sampled.jsonl")
    assert [t["data_source"] for t in sampled][:31] == ["nq"] * 30 + ["triviaqa"] and len(sampled) == 30 + 6 * 2
    assert sampled[0]["id"] == sampled[0]["task_id"] == "nq_0"
    if nq_rows:
        assert sampled[3]["question"] == nq_rows[3]["question"] and sampled[3]["answer"] == nq_rows[3]["golden_answers"]
    from drmas_envs.search.data import load_qa_file

    train = load_qa_file(out / "train.jsonl")  # the preset's env.kwargs.tasks
    assert len(train) == 5 and train[0].task_id == "nq_0" and train[0].answers == ("nq answer 0",)
    assert [t.data_source for t in load_tasks(str(out / "test_sampled.jsonl"))][-1] == "bamboogle"


def test_search_recipe_rejects_a_test_file_without_the_seven_sources(tmp_path):
    raw = tmp_path / "raw"
    _search_raw(raw)
    rows = [r for r in _read(raw / "nq_hotpotqa_train/test.jsonl") if r["data_source"] != "bamboogle"]
    _jsonl(raw / "nq_hotpotqa_train/test.jsonl", rows)
    with pytest.raises(DataPrepError, match=r"not the reference's test set \(seven QA benchmarks\): data_source tags "
                                            r"missing \['bamboogle'\], unexpected \[\]"):  # fmt: skip
        prepare("drmas_search", raw, tmp_path / "out")


def test_wiki18_decompresses_and_joins_the_index_parts(tmp_path, capsys):
    raw, out = tmp_path / "raw", tmp_path / "out"
    (raw / "searchR1").mkdir(parents=True)
    lines = [json.dumps({"id": str(i), "contents": f'"T{i}"\ntext {i}'}) + "\n" for i in range(4)]
    with gzip.open(raw / "searchR1/wiki-18.jsonl.gz", "wt") as handle:
        handle.writelines(lines)
    (raw / "searchR1/part_aa").write_bytes(b"\x00\x01" * 10)
    (raw / "searchR1/part_ab").write_bytes(b"\xff" * 3)
    assert data_main(["prepare", "wiki18", "--raw", str(raw), "--out", str(out)]) == 0
    assert (out / "wiki-18.jsonl").read_text() == "".join(lines)
    assert (out / "e5_Flat.index").read_bytes() == b"\x00\x01" * 10 + b"\xff" * 3
    printed = capsys.readouterr().out
    assert f"--index_path {out}/e5_Flat.index --corpus_path {out}/wiki-18.jsonl --topk 3" in printed
    # drmas's own server on the same files, with the retrieval-server CLI's real flags
    command = f"drmas retrieval-server --index {out}/e5_Flat.index --corpus {out}/wiki-18.jsonl --model intfloat/e5-base-v2"
    assert command in printed
    from drmas_train.commands.retrieval_server import _parser

    args = _parser().parse_args(command.split()[2:] + ["--device", "cuda", "--port", "8000"])
    assert (args.index, args.corpus, args.model, args.device, args.port) == (
        f"{out}/e5_Flat.index", f"{out}/wiki-18.jsonl", "intfloat/e5-base-v2", "cuda", 8000)
    assert json.loads((out / "MANIFEST.json").read_text())["outputs"]["wiki-18.jsonl"]["rows"] == 4
