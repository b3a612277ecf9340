"""vLLM's layer-id rule depends on the target's architecture (harness.engines.vllm.
VLLM_CONVENTIONS): deepseek_v2.py captures before layer idx with an unguarded residual (boundary 0
crashes), the models built on EagleModelMixin capture boundary 0 before their loop. The adapter
once declared the deepseek_v2 rule for every target; on golden/tiny-qwen3moe the suite's own
fix check then found "the diagnosis says no id list fixes this, but ids [0, 4, 6] capture
exactly [0, 4, 6]: the diagnosis is wrong". The table is checked here against the installed
vLLM's own classes, and the mixin's capture is executed, not re-typed."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from harness.core.boundaries import LayerIdError, boundaries_to_ids, get_convention
from harness.engines.base import EngineUnavailable
from harness.engines.vllm import VLLM_CONVENTIONS, VllmEngine, convention_for

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def test_each_bundle_gets_the_rule_of_its_architecture() -> None:
    assert VllmEngine.convention_for_target(GOLDEN / "tiny-dsv3" / "target") == "vllm"
    assert VllmEngine.convention_for_target(GOLDEN / "tiny-qwen3moe" / "target") == "vllm-llama"
    # the embed-first fix the old rule could not word: boundary 0 is id 0 under b = id
    assert list(boundaries_to_ids([0, 4, 6], "vllm-llama", 8)) == [0, 4, 6]
    with pytest.raises(LayerIdError, match="cannot capture boundary 0"):
        boundaries_to_ids([0, 4, 6], "vllm", 8)


def test_an_unmodelled_architecture_is_refused_in_one_line(tmp_path: Path) -> None:
    """Judging a target by another model's rule would word wrong fixes: refused, named."""
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen3_5ForCausalLM"]}')
    with pytest.raises(EngineUnavailable) as e:
        VllmEngine.convention_for_target(tmp_path)
    message = str(e.value)
    assert len(message.splitlines()) == 1 and "Qwen3_5ForCausalLM" in message
    assert "VLLM_CONVENTIONS" in message
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(EngineUnavailable, match="cannot read the target's architecture"):
        VllmEngine.convention_for_target(tmp_path)


def _vllm_model_module(architecture: str) -> ModuleType:
    from vllm.model_executor.models import registry

    module, _cls = registry._TEXT_GENERATION_MODELS[architecture]
    return importlib.import_module(f"vllm.model_executor.models.{module}")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM not installed (pip install -e '.[vllm]'): the table is not checked "
                           "against its classes")
def test_the_table_is_vllms_own_classes() -> None:
    """Each architecture's vLLM model module (through vLLM's own registry): "vllm-llama" where
    its model class is an EagleModelMixin that keeps the mixin's capture, "vllm" where the module
    has no such class (deepseek_v2.py's own loop); and the mixin's capture, executed, hands back
    the embedding for boundary 0 (residual None before layer 0)."""
    from vllm.model_executor.models.interfaces import EagleModelMixin

    for architecture, convention in VLLM_CONVENTIONS.items():
        module = _vllm_model_module(architecture)
        mixed = [c for c in vars(module).values()
                 if isinstance(c, type) and issubclass(c, EagleModelMixin)
                 and c.__module__ == module.__name__]
        if convention == "vllm-llama":
            assert mixed, f"{architecture}: {module.__name__} has no EagleModelMixin model"
            assert all(c._maybe_add_hidden_state is EagleModelMixin._maybe_add_hidden_state
                       for c in mixed), f"{architecture}: the mixin's capture is overridden"
        else:
            assert not mixed, f"{architecture}: {module.__name__} now uses the mixin: update the table"
        assert convention_for(architecture) == convention

    class Holder:  # what the mixin reads: the layers set by set_aux_hidden_state_layers
        aux_hidden_state_layers = (0, 4)

    embedding = torch.randn(3, 8)
    out = EagleModelMixin._maybe_add_hidden_state(Holder(), [], 0, embedding, None)
    assert len(out) == 1 and torch.equal(out[0], embedding)
    assert get_convention("vllm-llama").capture_embedding and get_convention("vllm-llama").sorts_ids
