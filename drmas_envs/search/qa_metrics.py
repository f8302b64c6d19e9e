"""Open-domain QA metrics: SQuAD answer normalisation, exact match (EM), substring EM (SubEM) and token F1.

Every metric compares one predicted answer with a *set* of gold answers and returns the maximum over the golds,
as in the SQuAD v1.1 evaluation script (Rajpurkar et al., 2016) and Search-R1's ``qa_em`` reward
(Jin et al., 2025, arXiv 2503.09516). Pure functions of strings; no env code.

An empty prediction (after normalisation) scores 0 under every metric, even against a gold that normalises to
the empty string, so "say nothing" is never rewarded. SubEM (gold contained in prediction) can be gamed by
listing candidates (``"A or B or C"``); that is why the search envs reward EM and only report SubEM.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Iterable

__all__ = ["normalize_answer", "exact_match", "sub_exact_match", "token_f1", "qa_scores"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace.

    >>> normalize_answer("  The  Eiffel-Tower! ")
    'eiffeltower'
    """
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Iterable[str]) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    out = list(golds)
    if not all(isinstance(g, str) for g in out):
        raise TypeError(f"gold answers must be str or a sequence of str, got {golds!r}")
    return out


def exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals some normalised gold answer, else 0.0 (max over golds)."""
    golds, pred = _golds(golds), normalize_answer(prediction)
    if not pred:
        return 0.0
    return float(any(pred == normalize_answer(g) for g in golds))


def sub_exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 if some normalised (non-empty) gold answer is a substring of the normalised prediction, else 0.0."""
    golds, pred = _golds(golds), normalize_answer(prediction)
    if not pred:
        return 0.0
    return float(any((g_n := normalize_answer(g)) and g_n in pred for g in golds))


def token_f1(prediction: str, golds: str | Iterable[str]) -> float:
    """SQuAD token F1 between the normalised prediction and each gold answer; the maximum over golds.

    F1 = 2 P R / (P + R) with P = overlap / |pred tokens|, R = overlap / |gold tokens|, where overlap counts
    common tokens with multiplicity (SQuAD v1.1 ``f1_score``).
    """
    golds, pred_tokens = _golds(golds), normalize_answer(prediction).split()
    if not pred_tokens:
        return 0.0
    best = 0.0
    for gold in golds:
        gold_tokens = normalize_answer(gold).split()
        common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def qa_scores(prediction: str, golds: str | Iterable[str]) -> dict[str, float]:
    """``{"em", "subem", "f1"}`` of one prediction against its gold answers."""
    return {
        "em": exact_match(prediction, golds),
        "subem": sub_exact_match(prediction, golds),
        "f1": token_f1(prediction, golds),
    }
