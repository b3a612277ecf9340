"""Inferring an engine's layer-id rule from the configs it served (harness.diagnosis.observed_convention):
each candidate rule is recognised from the lists that separate it, ambiguity is reported as
ambiguity, and the fix wording says what was measured."""

from __future__ import annotations

from harness.diagnosis.observed_convention import (
    DEFAULTS,
    Observation,
    disagreements,
    fix_result,
    infer,
    infer_layout,
    literal_ids,
)

N = 8
NESTED = "specforge-nested"


def _obs(ids, slots=None, crash=None, layout=NESTED, told=None) -> Observation:
    return Observation(layout, tuple(ids), N, None if slots is None else tuple(slots), crash, told)


def test_b_equals_id_ascending_with_a_crash() -> None:
    """vLLM 0.32 deepseek_v2 as measured: b = id, slots ascending, id 0 crashes."""
    seen = infer_layout([_obs([1, 5, 3], [1, 3, 5]), _obs([4], [4]),
                         _obs([0, 4, 6], crash="TypeError: unsupported operand")])
    assert seen["rule"] == "b = id" and seen["slot_order"] == "ascending" and seen["reads_ids"]
    assert seen["crashes"] == [{"ids": [0, 4, 6], "all_ids": [[0, 4, 6]],
                                "error": "TypeError: unsupported operand"}]
    assert seen["serves"]["eagle3-original"].startswith("yes; only when the ids are listed in ascending")
    assert seen["serves"]["specforge"].startswith("no")
    assert seen["trainers"]["eagle3-original"]["served_correctly"] is False  # unsorted + id 0
    assert not seen["trainers"]["specforge"]["served_correctly"]


def test_conditional_shift_needs_a_list_starting_with_one() -> None:
    only_first_one = infer_layout([_obs([1, 5, 3], [2, 6, 4])])
    assert only_first_one["rule"] == "b = id + 1"
    assert any("PR #25454" in r for r in only_first_one["also_consistent"])
    both = infer_layout([_obs([1, 5, 3], [2, 6, 4]), _obs([4], [4])])
    assert "PR #25454" in both["rule"] and not both["also_consistent"]
    assert both["slot_order"] == "config order"


def test_defaults_regardless_of_ids() -> None:
    seen = infer_layout([_obs([1, 5, 3], [2, 4, 5]), _obs([4], [2, 4, 5])])
    assert seen["rule"] == DEFAULTS and seen["reads_ids"] is False
    assert infer([_obs([4], [2, 4, 5])])["formats_read"] == []


def test_order_not_determined_by_ascending_lists_alone() -> None:
    seen = infer_layout([_obs([2, 4, 5], [2, 4, 5])])
    assert seen["rule"] == "b = id" and seen["slot_order"].startswith("not determined")


def test_disagreements_with_a_declared_rule() -> None:
    observations = [_obs([1, 5, 3], [1, 3, 5]), _obs([0], crash="TypeError")]
    assert disagreements("vllm", observations) == []  # sorted b = id; id 0 left to the property
    wrong = disagreements("eagle3-original", observations)
    assert len(wrong) == 2 and "[1, 5, 3]" in wrong[0] and "crashed" in wrong[1]


def test_fix_wording() -> None:
    text, ok = fix_result([2, 4, 5], NESTED, [2, 4, 5], True, [2, 4, 5], None)
    assert ok and text.startswith("fix verified")
    text, ok = fix_result([2, 4, 5], NESTED, [2, 4, 5], True, [2, 4, 4], None)
    assert not ok and text.startswith("fix fails: ")
    text, ok = fix_result([0, 4, 6], NESTED, [0, 4, 6], False, None, "TypeError: + NoneType")
    assert ok and text.startswith("no fix:") and "TypeError" in text
    text, ok = fix_result([0, 4, 6], NESTED, [0, 4, 6], False, [0, 4, 6], None)
    assert not ok and "diagnosis is wrong" in text
    assert literal_ids([0, 4, 6], "vllm", N) == (0, 4, 6)


def test_observation_json_round_trip() -> None:
    o = _obs([-1, 4], [0, "final_normed"], told="embedding-minus-one")
    assert Observation.from_json(o.to_json()) == o


def test_report_carries_the_observed_convention(tmp_path) -> None:
    """report.json's `observed_convention` is always there (a stable key), and report.md and
    the conformance table print the rule and each fix's result."""
    import json

    from harness.reports.report import ReportCollector
    from harness.reports.report_md import render_conformance_table, render_markdown

    empty = ReportCollector().build(engine={"name": "e"}, bundle={}, drafts=[], dtype="float32",
                                    started=0.0, finished=1.0)
    assert empty["observed_convention"] == {"layouts": {}, "formats_read": [], "fixes": []}
    collector = ReportCollector()
    collector.observe(_obs([1, 5, 3], [1, 3, 5]))
    collector.observe(_obs([1, 5, 3], [9, 9, 9]))  # the first observation of a config stays
    collector.observe(_obs([0], crash="TypeError: + NoneType"))
    collector.fix("single-aux", {"ids": [4], "layout": NESTED, "result": "fix verified: ids [4]"})
    report = collector.build(engine={"name": "e"}, bundle={}, drafts=[], dtype="float32",
                             started=0.0, finished=1.0)
    layout = report["observed_convention"]["layouts"][NESTED]
    assert layout["rule"] == "b = id" and layout["slot_order"] == "ascending"
    md = render_markdown(report)
    assert "## Observed layer-id convention" in md and "fix verified: ids [4]" in md
    assert "TypeError: + NoneType" in md
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    assert "## Observed layer-id conventions" in render_conformance_table([path])
