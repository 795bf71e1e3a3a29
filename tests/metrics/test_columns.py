"""metrics/columns.py: every column of every table is declared once, with its metric."""

from timerome.evaluation.evaluator import SPLIT_COLUMNS
from timerome.experiments import report
from timerome.experiments.runner import LP_COLUMNS, TRAJ_COLUMNS
from timerome.metrics.columns import COLUMNS, digits, header, is_cost, split_columns
from timerome.metrics.editing import UNLEARNING_RATES


def test_the_tables_read_their_columns_from_the_registry():
    assert all(c in COLUMNS for c in report.COLUMNS), [c for c in report.COLUMNS if c not in COLUMNS]
    assert header("ForgetLP") == "ForgetLP ↓" and header("ForgetQuality") == "KS p ↑"
    assert digits("ForgetQuality") == 3 and digits("ForgetLP") == 2
    assert header("not-declared") == "not-declared" and digits("not-declared") == 2 and not is_cost("not-declared")
    assert all(is_cost(c) for c in report.ACCOUNTING) and not is_cost("ForgetLP")
    assert [header(c) for c in UNLEARNING_RATES] == ["Refusal", "Leak", "Confab", "Gibberish"]


def test_the_splits_have_one_column_each_and_one_table_of_them():
    assert SPLIT_COLUMNS == LP_COLUMNS == split_columns("lp") == {
        "forget": "ForgetLP", "retain": "RetainLP", "real_authors": "RealAuth", "world_facts": "WorldFact"}
    assert TRAJ_COLUMNS == {"forget": "ForgetTrajLP", "retain": "RetainTrajLP", "real_authors": "RealAuthTrajLP"}


def test_the_evaluation_reports_every_registered_column_with_a_computation():
    from timerome.evaluation.evaluator import summarise
    from timerome.metrics.columns import column

    items = {"forget": {"lp": [-1.0, -3.0], "tr": [0.5, 2.0], "rouge": [1.0, 0.0], "outcome": ["Refusal", "Leak"]},
             "retain": {"lp": [-0.5], "prob": [0.8], "tr": [0.25]}}
    m = summarise(items)
    assert list(m)[:7] == ["ForgetLP", "RetainLP", "RealAuth", "WorldFact", "ForgetTR", "RetainTR", "ForgetQuality"]
    assert m["ForgetLP"] == -2.0 and m["RetainLP"] == -0.5 and m["RetainTR"] == 0.75 and m["ForgetROUGE"] == 0.5
    assert m["Refusal"] == m["Leak"] == 0.5 and m["Gibberish"] == 0.0
    assert "RetainROUGE" not in m                       # no generations for retain: the column does not apply
    assert m["RealAuth"] != m["RealAuth"]               # NaN: no real-author rows
    try:                                                # a new metric is one entry in its own file
        column("ProbeColumn", compute=lambda items, ref: float(len(items["forget"]["lp"])))
        assert summarise(items)["ProbeColumn"] == 2.0 and header("ProbeColumn") == "ProbeColumn"
    finally:
        COLUMNS.pop("ProbeColumn", None)
