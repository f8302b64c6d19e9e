"""Retrieval corpora: the ``Passage`` record, the wiki-18 / FlashRAG JSONL format and HotpotQA contexts.

Format (Search-R1 / FlashRAG ``wiki-18.jsonl``): one JSON object per line, ``{"id": str, "contents": str}``
where ``contents`` is ``'"Title"\\ntext'`` (the title on the first line, in double quotes). :func:`parse_contents`
and :func:`format_contents` convert between that string and ``(title, text)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "Passage",
    "format_contents",
    "parse_contents",
    "load_corpus_jsonl",
    "save_corpus_jsonl",
    "hotpotqa_corpus",
    "corpus_hash",
]


@dataclasses.dataclass(frozen=True)
class Passage:
    """One retrievable passage.

    Attributes:
        id: unique id within its corpus.
        title: the article title (may be empty).
        text: the passage body.
        score: retrieval score (higher is better; 0.0 for corpus entries that were not retrieved).
    """

    id: str
    title: str
    text: str
    score: float = 0.0

    @property
    def contents(self) -> str:
        """The wiki-18 ``contents`` string: ``'"Title"\\ntext'``."""
        return format_contents(self.title, self.text)

    def to_document(self) -> dict[str, str]:
        """The retrieval-server document ``{"id", "contents"}`` (Search-R1 protocol)."""
        return {"id": self.id, "contents": self.contents}

    def with_score(self, score: float) -> Passage:
        """A copy carrying ``score``."""
        return dataclasses.replace(self, score=float(score))


def format_contents(title: str, text: str) -> str:
    """``'"Title"\\ntext'`` as in wiki-18."""
    return f'"{title}"\n{text}'


def parse_contents(contents: str) -> tuple[str, str]:
    """``(title, text)`` from a wiki-18 ``contents`` string; the title's surrounding quotes are removed.

    A single-line ``contents`` has an empty title.
    """
    head, sep, body = contents.partition("\n")
    if not sep:
        return "", contents
    head = head.strip()
    if len(head) >= 2 and head[0] == head[-1] == '"':
        head = head[1:-1]
    return head, body


def passage_from_document(doc: Mapping[str, Any], *, where: str = "document") -> Passage:
    """A :class:`Passage` from ``{"id", "contents"}`` (or ``{"id", "title", "text"}``).

    Raises:
        ValueError: the document lacks the fields (names ``where`` and the missing field).
    """
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: expected a JSON object with 'id' and 'contents', got {type(doc).__name__}")
    if "id" not in doc:
        raise ValueError(f"{where}: missing field 'id' (expected {{'id', 'contents'}})")
    if "contents" in doc:
        title, text = parse_contents(str(doc["contents"]))
    elif "text" in doc:
        title, text = str(doc.get("title", "")), str(doc["text"])
    else:
        raise ValueError(f"{where}: missing field 'contents' (expected {{'id', 'contents'}} or {{'id', 'title', 'text'}})")
    return Passage(str(doc["id"]), title, text)


def load_corpus_jsonl(path: str | Path, *, limit: int | None = None) -> list[Passage]:
    """Read a wiki-18 / FlashRAG corpus file (JSONL ``{"id", "contents"}``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a malformed line (names the file and line), duplicate ids, or an empty corpus.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} not found (expected JSONL rows {{'id', 'contents'}})")
    passages: list[Passage] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            passages.append(passage_from_document(row, where=f"{path}:{lineno}"))
            if limit is not None and len(passages) >= limit:
                break
    _check_corpus(passages, str(path))
    return passages


def save_corpus_jsonl(passages: Iterable[Passage], path: str | Path) -> Path:
    """Write passages as wiki-18 JSONL (inverse of :func:`load_corpus_jsonl`)."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps(p.to_document(), ensure_ascii=False) + "\n")
    return path


def hotpotqa_corpus(rows: Iterable[Mapping[str, Any]]) -> list[Passage]:
    """The union of HotpotQA ``context`` paragraphs as a corpus, one passage per distinct (title, text).

    Accepts both the HF schema (``context = {"title": [...], "sentences": [[...], ...]}``) and the original
    JSON schema (``context = [[title, [sentences]], ...]``). Sentences are joined with ``""`` as HotpotQA's
    sentences carry their own leading spaces. Ids are the title, suffixed ``#2``, ``#3``... when one title has
    several distinct paragraphs.
    """
    seen: dict[tuple[str, str], None] = {}
    for row in rows:
        for title, sentences in hotpotqa_paragraphs(row):
            seen.setdefault((title, "".join(sentences).strip()), None)
    per_title: dict[str, int] = {}
    passages = []
    for title, text in seen:
        n = per_title[title] = per_title.get(title, 0) + 1
        passages.append(Passage(title if n == 1 else f"{title}#{n}", title, text))
    _check_corpus(passages, "hotpotqa contexts")
    return passages


def hotpotqa_paragraphs(row: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """``[(title, sentences), ...]`` of one HotpotQA row, HF or original schema.

    Raises:
        ValueError: the row has no usable ``context``.
    """
    ctx = row.get("context")
    if isinstance(ctx, Mapping) and "title" in ctx and "sentences" in ctx:
        return [(str(t), list(s)) for t, s in zip(ctx["title"], ctx["sentences"], strict=True)]
    if isinstance(ctx, Sequence) and not isinstance(ctx, str):
        return [(str(t), list(s)) for t, s in ctx]
    raise ValueError(f"HotpotQA row {row.get('id', row.get('_id', '?'))!r}: missing or malformed 'context'")


def corpus_hash(passages: Sequence[Passage]) -> str:
    """SHA-256 (hex, first 16 chars) over ids, titles and texts in order: the corpus' cache key."""
    h = hashlib.sha256()
    for p in passages:
        for field in (p.id, p.title, p.text):
            b = field.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()[:16]


def _check_corpus(passages: Sequence[Passage], where: str) -> None:
    if not passages:
        raise ValueError(f"{where}: the corpus is empty")
    ids = set()
    for p in passages:
        if p.id in ids:
            raise ValueError(f"{where}: duplicate passage id {p.id!r}")
        ids.add(p.id)
