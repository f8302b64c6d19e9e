import pytest

from drmas_envs.search.qa_metrics import exact_match, normalize_answer, qa_scores, sub_exact_match, token_f1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple, a day! ", "apple day"),
        ("Théâtre", "théâtre"),
        ("U.S.A.", "usa"),
        ("the", ""),
        ("", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    ("pred", "golds", "em", "subem", "f1"),
    [
        ("Paris", ["paris"], 1.0, 1.0, 1.0),
        ("the Paris.", ("Paris", "Lyon"), 1.0, 1.0, 1.0),
        ("Lyon", ("Paris", "Lyon"), 1.0, 1.0, 1.0),  # max over golds
        ("Paris or Lyon or Nice", ["Paris"], 0.0, 1.0, 1 / 3),  # listing: EM 0, SubEM games it; P=1/5 R=1
        ("", ["Paris"], 0.0, 0.0, 0.0),
        ("", ["the"], 0.0, 0.0, 0.0),  # empty prediction never scores, even vs a gold normalising to ""
        ("a", ["the"], 0.0, 0.0, 0.0),
        ("New York City", ["New York"], 0.0, 1.0, 0.8),  # P=2/3 R=1 -> 0.8
        ("York New", ["New York"], 0.0, 0.0, 1.0),
        ("40 members", ["40"], 0.0, 1.0, 2 / 3),
        ("Kevin Spacey", "Kevin Spacey", 1.0, 1.0, 1.0),  # a bare str gold
    ],
)
def test_metric_table(pred, golds, em, subem, f1):
    assert exact_match(pred, golds) == em
    assert sub_exact_match(pred, golds) == subem
    assert token_f1(pred, golds) == pytest.approx(f1)
    assert qa_scores(pred, golds) == pytest.approx({"em": em, "subem": subem, "f1": f1})


def test_f1_counts_repeated_tokens_with_multiplicity():
    # pred "a b b", gold "b b c": overlap 2, P = 2/3, R = 2/3
    assert token_f1("x y y", ["y y z"]) == pytest.approx(2 / 3)


def test_bad_gold_type():
    with pytest.raises(TypeError, match="gold answers must be str or a sequence of str"):
        exact_match("a", [1, 2])
