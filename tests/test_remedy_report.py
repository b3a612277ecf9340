"""What a report says of each diagnosis' remedy (issue #31, item 2), without an engine: which
remedies are a config change and what is re-served for them (harness.diagnosis.remedy.plan),
and how report.json and report.md carry "verified" / "unverified: <why>" per diagnosis."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from harness.diagnosis.record import KINDS, Diagnosis
from harness.diagnosis.remedy import CONFIG_REMEDIES, ConfigChange, plan
from harness.golden.bundle import load_bundle
from harness.golden.draft_factory import NESTED, TOP_LEVEL, DraftFactory
from harness.golden.paths import default_bundle_path
from harness.reports.report import ReportCollector
from harness.reports.report_md import render_markdown


def _diag(kind: str, found: list, train: list, *, suggested: list | None = None, offset: int | None = None,
          addressee: str | None = "undetermined") -> Diagnosis:
    return Diagnosis(kind=kind, message=f"root cause: {kind}.", engine_boundaries=found,
                     training_boundaries=train, suggested_layer_ids=suggested, offset=offset,
                     details={"addressee": addressee})


def _plan(diag: Diagnosis, ids: list[int], told: str | None = "specforge", convention: str | None = None):
    return plan(diag, config_ids=ids, layout=NESTED, trained=diag.training_boundaries, num_layers=8,
                told=told, engine_convention=convention)


def test_config_remedies_are_kinds() -> None:
    assert set(CONFIG_REMEDIES) <= set(KINDS)


def test_order_permuted_is_remedied_by_the_engines_order_and_fc_blocks_to_match() -> None:
    (change,) = _plan(_diag("order_permuted", [5, 4, 2], [2, 4, 5]), [1, 3, 4])
    assert change == ConfigChange(ids=(4, 3, 1), layout=NESTED, expected=(5, 4, 2), told="specforge",
                                  slot_order=(2, 1, 0))


def test_an_undeclared_offset_is_remedied_by_the_ids_the_shift_calls_for() -> None:
    (change,) = _plan(_diag("offset", [3, 5, 6], [2, 4, 5], offset=1), [1, 3, 4])
    assert change.ids == (0, 2, 3) and change.expected == (2, 4, 5)
    # a shift past the embedding has no id list: why, not a change
    why = _plan(_diag("offset", [1, 5, 7], [0, 4, 6], offset=1), [-1, 3, 5], told="embedding-minus-one")
    assert isinstance(why, str) and "boundary -1" in why


def test_suggested_ids_for_ignored_ids_are_tried_in_both_layouts() -> None:
    changes = _plan(_diag("ids_ignored", [2, 4, 5], [2, 4, 8], suggested=[2, 4, 8], addressee="draft owner"),
                    [1, 3, 7], told=None, convention="vllm")
    assert [(c.ids, c.layout) for c in changes] == [((2, 4, 8), NESTED), ((2, 4, 8), TOP_LEVEL)]


def test_an_engine_change_is_no_config_change() -> None:
    for kind in ("residual_missing", "fc_wrong", "d2t_absolute", "draft_kv_not_rolled_back"):
        why = _plan(_diag(kind, [], [2, 4, 5], addressee="engine vendor"), [1, 3, 4])
        assert isinstance(why, str) and why.startswith(f"the remedy is an engine change ({kind}"), why
    # an offset whose config ids already mean training's boundaries in the declared convention
    why = _plan(_diag("offset", [3, 5, 6], [2, 4, 5], offset=1, addressee="engine vendor"), [1, 3, 4],
                told=None, convention="sglang")
    assert isinstance(why, str) and why.startswith("the remedy is an engine change (for the engine vendor)")


def test_report_carries_each_diagnosis_remedy() -> None:
    collector = ReportCollector()
    for name, draft, kind in (("capture", "a", "order_permuted"), ("residual", "b", "residual_missing"),
                              ("offset", "c", "offset")):
        collector.check(name, name, draft=draft)
        collector.diagnosis(name, _diag(kind, [5, 4, 2], [2, 4, 5],
                                        addressee="engine vendor" if kind == "residual_missing" else None))
        collector.checks[name].settle("failed", "off")
    collector.fix("a", {"diagnosis_kind": "order_permuted", "remedy": "verified",
                        "result": "verified: re-served with ids [4, 3, 1]", "ids": [4, 3, 1]})
    report = collector.build(engine={"name": "e"}, bundle={}, drafts=["a", "b", "c"], dtype="float32",
                             started=0.0, finished=1.0)
    remedies = {d["draft"]: d["remedy"] for d in report["diagnoses"]}
    assert remedies["a"] == {"status": "verified", "result": "verified: re-served with ids [4, 3, 1]"}
    assert remedies["b"]["status"] == "unverified" and "engine change" in remedies["b"]["result"]
    assert remedies["c"]["status"] == "unverified" and "not re-served" in remedies["c"]["result"]
    json.dumps(report)
    md = render_markdown(report)
    assert "  - remedy verified: re-served with ids [4, 3, 1]" in md
    assert "| a | order_permuted | [4, 3, 1] |" in md


def test_a_remedied_copy_keeps_the_trained_projection() -> None:
    """The copy's fc, fed the slots in its own order, is the trained fc fed them in training's."""
    bundle = load_bundle(default_bundle_path())
    with tempfile.TemporaryDirectory() as scratch:
        folder = DraftFactory(bundle, Path(scratch)).remedied("specforge-default", [4, 3, 1], NESTED, [2, 1, 0])
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [4, 3, 1]
        copy, original = (load_file(str(p / "model.safetensors"))
                          for p in (folder, bundle.draft_dir("specforge-default")))
    assert torch.equal(copy["d2t"], original["d2t"])
    h = cfg["target_hidden_size"]
    aux = torch.randn(5, 3 * h)
    reordered = torch.cat([aux[:, p * h:(p + 1) * h] for p in (2, 1, 0)], dim=-1)
    assert torch.allclose(reordered @ copy["fc.weight"].T, aux @ original["fc.weight"].T, atol=1e-5)
