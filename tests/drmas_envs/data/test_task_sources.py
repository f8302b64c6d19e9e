"""Task sources: file loaders (GSM8K / MATH-500 / AIME schemas), reasoning-gym, HF offline, load_tasks specs."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drmas_envs.core import ListTaskSource, Task
from drmas_envs.data import (
    DataFormatError,
    HFUnavailableError,
    ReasoningGymSource,
    data_source_from_path,
    gsm8k_final_answer,
    load_file,
    load_tasks,
)
from helpers.shared_data import shared_file


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_gsm8k_rows(tmp_path):
    path = _write_jsonl(
        tmp_path / "gsm8k_test.jsonl",
        [{"question": "1+1?", "answer": "1+1=2\n#### 2"}, {"question": "big?", "answer": "so\n#### 1,250"}],
    )
    tasks = load_tasks(path)
    assert len(tasks) == 2
    assert tasks[0] == Task("gsm8k-0", "gsm8k", "1+1?", "2", {"solution": "1+1=2\n#### 2"})
    assert tasks[1].answer == "1250"


@pytest.mark.parametrize(
    ("solution", "final"),
    [("x\n#### 42", "42"), ("#### -3.5", "-3.5"), ("#### 1,000,000", "1000000"), ("#### 3/4", "3/4")],
)
def test_gsm8k_final_answer(solution, final):
    assert gsm8k_final_answer(solution) == final


def test_math500_rows_keep_metadata(tmp_path):
    row = {
        "problem": "What is $1/2$?",
        "solution": "...",
        "answer": "\\frac{1}{2}",
        "subject": "Algebra",
        "level": 2,
    }
    tasks = load_file(_write_jsonl(tmp_path / "math500_test.jsonl", [row]))
    assert tasks[0] == Task(
        "math500-0",
        "math500",
        "What is $1/2$?",
        "\\frac{1}{2}",
        {"solution": "...", "subject": "Algebra", "level": 2},
    )


def test_aime_numbers_become_strings_and_data_source_can_be_given(tmp_path):
    path = _write_jsonl(tmp_path / "problems.jsonl", [{"problem": "p", "answer": 204, "id": 7}])
    tasks = load_tasks(str(path), data_source="aime24")
    assert (tasks[0].task_id, tasks[0].data_source, tasks[0].answer) == ("7", "aime24", "204")


def test_parquet_round_trip_and_row_data_source(tmp_path):
    table = pa.Table.from_pylist(
        [
            {"problem": "p1", "answer": "1", "data_source": "amc23"},
            {"problem": "p2", "answer": "2", "data_source": "amc23"},
        ]
    )
    pq.write_table(table, tmp_path / "amc.parquet")
    tasks = load_tasks(tmp_path / "amc.parquet", limit=1)
    assert [(t.task_id, t.data_source, t.answer) for t in tasks] == [("amc23-0", "amc23", "1")]


def test_tasks_format_round_trips(tmp_path):
    original = [Task("a", "src", "q?", ("x", "y"), {"k": 1}), Task("b", "src", "q2", "z")]
    tasks = load_tasks(_write_jsonl(tmp_path / "mine.jsonl", [t.to_dict() for t in original]))
    assert list(tasks) == original


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("gsm8k_test.jsonl", "gsm8k"),
        ("math500_test.jsonl", "math500"),
        ("aime24.parquet", "aime24"),
        ("nq-dev.jsonl", "nq"),
    ],
)
def test_data_source_from_path(tmp_path, name, source):
    assert data_source_from_path(tmp_path / name) == source


def test_malformed_row_names_file_line_and_field(tmp_path):
    path = _write_jsonl(
        tmp_path / "gsm8k_test.jsonl",
        [{"question": "a", "answer": "#### 1"}, {"question": "b", "answer": "#### 2"}, {"question": "c"}],
    )
    with pytest.raises(
        DataFormatError,
        match=re.escape(f"{path}:3: missing field 'answer' (format 'gsm8k' needs question, answer)"),
    ):
        load_tasks(path)


def test_malformed_values_and_lines(tmp_path):
    bad_marker = _write_jsonl(
        tmp_path / "g.jsonl",
        [{"question": "a", "answer": "#### 1"}, {"question": "b", "answer": "no marker"}],
    )
    with pytest.raises(
        DataFormatError,
        match=re.escape(f"{bad_marker}:2: field 'answer' has no '#### <final answer>' marker"),
    ):
        load_tasks(bad_marker)
    bad_json = tmp_path / "broken.jsonl"
    bad_json.write_text('{"problem": "p", "answer": "1"}\n\n{"problem": \n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=re.escape(f"{bad_json}:3: not valid JSON")):
        load_tasks(bad_json)
    bad_type = _write_jsonl(tmp_path / "t.jsonl", [{"problem": "p", "answer": ["1"]}])
    with pytest.raises(
        DataFormatError,
        match=re.escape(f"{bad_type}:1: field 'answer' must be a string or a number, got list"),
    ):
        load_tasks(bad_type)
    unknown = _write_jsonl(tmp_path / "u.jsonl", [{"prompt": "p"}])
    with pytest.raises(
        DataFormatError, match=re.escape(f"{unknown}:1: cannot infer the data format from fields ['prompt']")
    ):
        load_tasks(unknown)
    with pytest.raises(DataFormatError, match="unknown data format 'gsm9k'; known formats: "):
        load_tasks(bad_marker, format="gsm9k")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="no rows"):
        load_tasks(empty)


def test_missing_file_and_bad_spec(tmp_path):
    with pytest.raises(FileNotFoundError, match="task file '.*nope.jsonl' not found"):
        load_tasks(str(tmp_path / "nope.jsonl"))
    with pytest.raises(
        ValueError, match=re.escape("cannot read task spec 'gsm_symbolic': expected a file path")
    ):
        load_tasks("gsm_symbolic")
    with pytest.raises(TypeError, match="task spec must be a str, a pathlib.Path or a TaskSource, got int"):
        load_tasks(3)


def test_reasoning_gym_source_is_seeded_and_sized():
    a = load_tasks("reasoning_gym:gsm_symbolic", seed=3, size=5)
    b = ReasoningGymSource("gsm_symbolic", seed=3, size=5)
    assert isinstance(a, ReasoningGymSource) and len(a) == 5
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert a[4].task_id == "gsm_symbolic-3-4" and a[-1] == a[4]
    assert a[0].data_source == "reasoning_gym/gsm_symbolic"
    assert a[0].question != ReasoningGymSource("gsm_symbolic", seed=4, size=5)[0].question
    with pytest.raises(IndexError, match="task index 5 out of range for 5 tasks"):
        a[5]


def test_reasoning_gym_sources_are_shared_per_dataset_seed_and_size():
    # every env of a rollout batch builds its default tasks: one shared (immutable) source, not one per env
    a = load_tasks("reasoning_gym:gsm_symbolic", seed=3, size=5)
    assert load_tasks("reasoning-gym:gsm_symbolic", seed=3, size=5) is a
    assert load_tasks("reasoning_gym:gsm_symbolic", seed=4, size=5) is not a
    assert load_tasks("reasoning_gym:gsm_symbolic", seed=3, size=6) is not a
    with pytest.raises(ValueError, match="seed must be an int, got True"):
        load_tasks("reasoning_gym:gsm_symbolic", seed=True, size=5)  # not the cached seed=1 source


def test_reasoning_gym_any_dataset_and_unknown_name():
    tasks = load_tasks("reasoning_gym:basic_arithmetic", size=3)
    assert tasks[0].data_source == "reasoning_gym/basic_arithmetic" and tasks[0].answer
    with pytest.raises(
        ValueError, match="unknown reasoning-gym dataset 'gsm_symbolc'. Did you mean: gsm_symbolic"
    ):
        ReasoningGymSource("gsm_symbolc")
    with pytest.raises(ValueError, match="size must be a positive int, got 0"):
        ReasoningGymSource(size=0)


def test_hf_fails_fast_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        HFUnavailableError,
        match=re.escape("cannot load Hugging Face dataset hf:openai/gsm8k:main@test: offline mode is on"),
    ):
        load_tasks("hf:openai/gsm8k:main")
    with pytest.raises(ValueError, match="malformed Hugging Face spec 'hf:'"):
        load_tasks("hf:")


def test_task_source_passes_through():
    source = ListTaskSource([Task("t", "s", "q", "a")])
    assert load_tasks(source) is source


@pytest.mark.shared_data
def test_real_files_load():
    gsm = load_tasks(shared_file("gsm8k_test.jsonl"))
    math = load_tasks(shared_file("math500_test.jsonl"))
    assert (len(gsm), gsm[0].data_source, gsm[0].answer) == (1319, "gsm8k", "18")
    assert (len(math), math[0].data_source, math[0].extra["subject"]) == (500, "math500", "Precalculus")


def test_custom_format_plugs_into_the_loaders(tmp_path):
    from drmas_envs.data import RowFormat, formats, register_format
    from drmas_envs.data.row_formats import _FORMATS

    def to_task(row, index, data_source):
        return Task(
            f"{data_source}-{index}", data_source, row["question"], row["answer"], {"hint": row["hint"]}
        )

    fmt = RowFormat("unit_hinted", ("question", "answer", "hint"), to_task)
    register_format(fmt)
    try:
        assert formats()["unit_hinted"] is fmt
        with pytest.raises(ValueError, match="data format 'unit_hinted' is already registered"):
            register_format(fmt)
        # a row with question/answer/hint and '####' matches gsm8k too: the format with more fields wins
        path = _write_jsonl(tmp_path / "quiz_dev.jsonl", [{"question": "q", "answer": "#### 1", "hint": "h"}])
        tasks = load_tasks(path)
        assert tasks[0] == Task("quiz-0", "quiz", "q", "#### 1", {"hint": "h"})
        assert load_tasks(path, format="gsm8k")[0].answer == "1"
    finally:
        del _FORMATS["unit_hinted"]


def test_read_rows_json_array_and_jsonl_locations(tmp_path):
    from drmas_envs.data import read_rows

    array = tmp_path / "qa.json"
    array.write_text(json.dumps([{"q": 1}, {"q": 2}]))
    assert [(w.rsplit(":", 1)[1], r) for w, r in read_rows(array)] == [("item 1", {"q": 1}), ("item 2", {"q": 2})]
    lines = tmp_path / "qa.jsonl"
    lines.write_text('{"q": 1}\n\n{"q": 2}\n')
    assert [w.rsplit(":", 1)[1] for w, _ in read_rows(lines)] == ["1", "3"]
    array.write_text(json.dumps([{"q": 1}, 7]))
    with pytest.raises(ValueError, match=r"qa\.json:item 2: expected a JSON object, got int"):
        list(read_rows(array))
    with pytest.raises(FileNotFoundError, match=r"data file .*missing\.jsonl not found"):
        list(read_rows(tmp_path / "missing.jsonl"))


def test_qa_formats_load_without_importing_the_search_envs():
    """The data package owns the QA row formats: no hidden import of drmas_envs.search (one-way dependency)."""
    import subprocess
    import sys

    code = (
        "import sys; from drmas_envs.data import get_format, formats; "
        "assert {'hotpotqa', 'search_r1', 'flashrag'} <= set(formats()); get_format('flashrag'); "
        "print(sorted(m for m in sys.modules if m.startswith('drmas_envs.search')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_reasoning_gym_options_reach_the_dataset_and_bad_ones_name_its_options():
    options = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
               "allow_negation": False, "allow_parentheses": False}  # fmt: skip
    tasks = load_tasks("reasoning_gym:basic_arithmetic", size=50, options=options)
    for i in range(len(tasks)):  # two terms of one digit (reasoning-gym draws 0..10): the answer is their sum
        numbers = [int(x) for x in re.findall(r"\d+", tasks[i].question)]
        assert len(numbers) == 2 and all(n <= 10 for n in numbers) and int(tasks[i].answer) == sum(numbers)
    assert tasks.config == options
    with pytest.raises(ValueError, match=r"bad options \{'digits': 1\}.*its options: min_terms, max_terms"):
        load_tasks("reasoning_gym:basic_arithmetic", size=5, options={"digits": 1})
    with pytest.raises(ValueError, match="max_digits must be >= min_digits"):
        load_tasks("reasoning_gym:basic_arithmetic", size=5, options={"min_digits": 3, "max_digits": 1})


def _reference_math_row(question, truth, source, index, split="test"):
    """A row as langfengQ/DrMAS examples/data_preprocess/drmas_math.py:80-97 writes it (:49-66 for train rows)."""
    return {"data_source": source, "ability": "math", "reward_model": {"style": "rule", "ground_truth": truth},
            "prompt": [{"role": "user", "content": question}],
            "extra_info": {"split": split, "index": index, "answer": truth, "question": question},
            "env_kwargs": {"ground_truth": truth, "question": question, "data_source": source}}  # fmt: skip


def test_the_references_verl_math_rows_load(tmp_path):
    """The reference's math parquet (several data sources concatenated, drmas_math.py:115-123) loads as the verl
    format: question from extra_info, ground truth from reward_model, data_source and index from the row."""
    rows = [_reference_math_row("What is $\\frac{1}{2}+\\frac{1}{3}$?", "\\frac{5}{6}", "math500", 0),
            _reference_math_row("Find $x$ if $2x=14$.", "7", "aime24", 0),
            _reference_math_row("Find $y$.", "3", "dapo_filter", 5, split="train")]  # fmt: skip
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    tasks = load_tasks(str(path))
    assert [(t.task_id, t.data_source, t.question, t.answer) for t in tasks] == [
        ("math500-0", "math500", "What is $\\frac{1}{2}+\\frac{1}{3}$?", "\\frac{5}{6}"),
        ("aime24-0", "aime24", "Find $x$ if $2x=14$.", "7"),
        ("dapo_filter-5", "dapo_filter", "Find $y$.", "3"),
    ]
    assert tasks[2].extra == {"ability": "math", "split": "train"}
    # the question alone in the user message (no extra_info, no env_kwargs) is read from the prompt
    bare = {k: v for k, v in rows[1].items() if k not in ("extra_info", "env_kwargs")}
    assert load_tasks(str(_write_jsonl(tmp_path / "bare.jsonl", [bare])))[0].question == "Find $x$ if $2x=14$."


def test_malformed_verl_rows_name_the_field(tmp_path):
    row = _reference_math_row("q", "1", "math500", 0)
    no_question = {**row, "prompt": [], "extra_info": {}, "env_kwargs": {}}
    with pytest.raises(DataFormatError, match=re.escape("x.jsonl:1: missing field 'question': no extra_info.question, "
                                                        "env_kwargs.question or user message in 'prompt' (verl layout)")):  # fmt: skip
        load_tasks(str(_write_jsonl(tmp_path / "x.jsonl", [no_question])))
    empty_truth = {**row, "reward_model": {"style": "rule", "ground_truth": ""}}
    with pytest.raises(DataFormatError, match=re.escape("y.jsonl:1: field 'reward_model.ground_truth' must be a "
                                                        "non-empty string or a number, got ''")):  # fmt: skip
        load_tasks(str(_write_jsonl(tmp_path / "y.jsonl", [empty_truth])))


@pytest.mark.parametrize(
    ("prompt", "extra_info"),
    [
        # langfengQ/DrMAS examples/data_preprocess/drmas_search.py:28-30,48-49,69-75: a system message, the bare
        # question as the user message, extra_info.question
        ([{"role": "system", "content": "You are a helpful and harmless assistant."},
          {"role": "user", "content": "who wrote hamlet?"}], {"index": 0, "question": "who wrote hamlet?"}),
        # the bare question alone, no extra_info
        ([{"role": "user", "content": "who wrote hamlet?"}], None),
        # Search-R1's templated prompt: the text after 'Question:'
        ([{"role": "user", "content": "Answer the given question. ... Question: who wrote hamlet?\n"}], None),
    ],
)  # fmt: skip
def test_verl_search_rows_load_with_a_bare_or_templated_question(tmp_path, prompt, extra_info):
    row = {"data_source": "nq", "prompt": prompt, "ability": "fact-reasoning",
           "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare", "William Shakespeare"]}}}  # fmt: skip
    if extra_info is not None:
        row["extra_info"] = extra_info
    task = load_tasks(str(_write_jsonl(tmp_path / "nq_test.jsonl", [row])))[0]
    assert (task.task_id, task.data_source, task.question, task.answer) == (
        "nq-0", "nq", "who wrote hamlet?", ("Shakespeare", "William Shakespeare"))
