"""The draft factory (harness.golden.draft_factory): any id list in either layout, fc as wide
as the ids imply, bit-identical across sessions, never written into the bundle, and read back
by the reference loader and the config lint as a user's draft would be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from harness.golden.bundle import load_bundle
from harness.golden.draft_factory import FORMATS, NESTED, TOP_LEVEL, DraftFactory, DraftFactoryError
from harness.golden.paths import default_bundle_path
from harness.judgement.lint import lint_draft
from harness.models.draft import DraftConfig, Eagle3Draft


@pytest.fixture(scope="module")
def committed():
    return load_bundle(default_bundle_path(), verify_hashes=False)


@pytest.mark.parametrize("layout", FORMATS)
def test_ids_width_and_layout(committed, tmp_path: Path, layout: str) -> None:
    folder = DraftFactory(committed, tmp_path).folder((5, 1), layout)
    cfg = json.loads((folder / "config.json").read_text())
    if layout == NESTED:
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [5, 1]
        assert "eagle_aux_hidden_state_layer_ids" not in cfg
    else:
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [5, 1] and "eagle_config" not in cfg
        assert cfg["speculators_model_type"] == "eagle3" and "transformer_layer_config" in cfg
    assert DraftConfig.from_json(cfg).aux_layer_ids == (5, 1)
    draft = Eagle3Draft.load(folder)
    assert draft.fc.in_features == 2 * committed.hidden_size


def test_deterministic_cached_and_outside_the_bundle(committed, tmp_path: Path) -> None:
    a = DraftFactory(committed, tmp_path / "a")
    b = DraftFactory(committed, tmp_path / "b")
    assert a.folder([1, 3]) is a.folder((1, 3))  # cached per session
    wa, wb = (load_file(str(f.folder([1, 3]) / "model.safetensors")) for f in (a, b))
    assert all((wa[k] == wb[k]).all() for k in wa)
    other = load_file(str(a.folder([3, 1]) / "model.safetensors"))
    assert not (other["fc.weight"] == wa["fc.weight"]).all()  # seeded by the ids
    with pytest.raises(DraftFactoryError, match="inside the bundle"):
        DraftFactory(committed, Path(committed.path) / "scratch")
    with pytest.raises(DraftFactoryError, match="format"):
        a.folder([1], "yaml")


def test_lint_reads_factory_drafts(committed, tmp_path: Path) -> None:
    target = json.loads((committed.target_dir / "config.json").read_text())
    factory = DraftFactory(committed, tmp_path)
    assert lint_draft(factory.folder([1, 5, 3]), target, "specforge") == []
    dup = lint_draft(factory.folder([3, 1, 3]), target, "specforge")
    assert [p.field.endswith("eagle_aux_hidden_state_layer_ids") for p in dup] == [True]
    assert "3" in dup[0].message
    assert TOP_LEVEL in FORMATS


def test_a_speculators_keyed_checkpoint_loads_natively(committed, tmp_path: Path) -> None:
    """speculators saves the draft's decoder layer as `layers.0.*` (its converter's output, what
    vLLM's speculators format holds); the reference draft must load it as SpecForge's
    `midlayer.*`, tensor for tensor, without the real speculators package (issue #36;
    tests/test_speculators_native.py runs the real converter)."""
    import shutil

    from safetensors.torch import save_file

    source = committed.draft_dir(committed.draft_names[0])
    state = load_file(str(source / "model.safetensors"))
    renamed = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v
               for k, v in state.items()}
    assert renamed.keys() != state.keys(), "the committed draft has no midlayer.* keys to rename"
    folder = tmp_path / "speculators-keys"
    folder.mkdir()
    shutil.copy(source / "config.json", folder / "config.json")
    save_file(renamed, str(folder / "model.safetensors"))
    loaded = Eagle3Draft.load(folder).state_dict()
    differ = [k for k, v in state.items() if k not in loaded or not loaded[k].equal(v)]
    assert not differ, f"a layers.0.* checkpoint loads otherwise than its midlayer.* original: {differ}"
