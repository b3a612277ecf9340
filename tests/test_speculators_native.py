"""speculators, natively (issue #36, deliverable 2).

vLLM serves EAGLE-3 drafts in the speculators format: `speculators_model_type: eagle3`, the
llama fields under `transformer_layer_config`, the ids at the top level, read by vLLM as
b = id, and the decoder layer saved as `layers.0.*`. A SpecForge draft gets there through
speculators' own converter (`speculators.convert.eagle.eagle3_converter.Eagle3Converter`).
What runs here is the real `speculators==0.9.0`:

- its config parsing (`SpeculatorModelConfig.from_pretrained`, which dispatches on
  `speculators_model_type`) on the harness's own speculators-layout writer
  (harness/golden/draft_factory.py) and on the converter's output;
- its converter on the bundle's drafts, whose output the harness then reads natively
  (`DraftConfig.from_json`, `Eagle3Draft.load`) and runs: the converted draft, fed the golden
  features at the boundaries its converted ids mean to vLLM, must predict the golden draft
  tokens, and must stop doing so when the harness is perturbed (tests/perturbations.py).

Facts this pins (docs/DESIGN.md "speculators"): the converter does not carry a SpecForge
draft's nested ids (it writes `eagle_aux_hidden_state_layer_ids: null` unless told the ids),
copies ids it is told verbatim without re-expressing them in vLLM's b = id rule, and handles
three-slot drafts only.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from perturbations import PERTURBATIONS, HarnessView, judged
from safetensors.torch import load_file

from harness.core.boundaries import LayerIdError, boundaries_to_ids, ids_to_boundaries
from harness.golden.bundle import Bundle, load_bundle
from harness.golden.draft_factory import TOP_LEVEL, DraftFactory
from harness.golden.paths import default_bundle_path
from harness.golden.training import ttt_forward
from harness.models.draft import DraftConfig, Eagle3Draft, speculators_keys

REPO_ROOT = Path(__file__).resolve().parents[1]
SPECULATORS_VERSION = "0.9.0"
# speculators imports `datasets` (pyarrow, pandas) and `hs_connectors` at import time, none of
# which this project needs: they go into an ignored folder, put on sys.path (appended, so
# nothing installed is shadowed) only for these tests.
DEPS = Path(os.environ.get("SPECULATORS_DEPS", REPO_ROOT / ".specforge" / "speculators-deps"))
HOW_TO_RUN = (f"run `tox -e speculators`, or: pip install --no-deps speculators=={SPECULATORS_VERSION} "
              f"&& pip install --no-deps --target .specforge/speculators-deps datasets==5.1.0 "
              f"pyarrow pandas multiprocess xxhash hs-connectors==0.9.0; scripts/test.sh does both")
VLLM = "vllm"  # the convention vLLM reads a speculators draft's top-level ids in (b = id)


def _missing() -> str | None:
    try:
        version = importlib.metadata.version("speculators")
    except importlib.metadata.PackageNotFoundError:
        return f"speculators is not installed: {HOW_TO_RUN}"
    if version != SPECULATORS_VERSION:
        return f"speculators {version} is installed, these checks are written against {SPECULATORS_VERSION}: {HOW_TO_RUN}"
    if DEPS.is_dir() and str(DEPS) not in sys.path:
        sys.path.append(str(DEPS))
    try:
        import speculators.convert.eagle.eagle3_converter  # noqa: F401
    except ImportError as e:
        return f"speculators {version} does not import here ({e}): {HOW_TO_RUN}"
    return None


MISSING = _missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"speculators: {MISSING}")
THREE_SLOT_DRAFTS = ("specforge-default", "embed-first", "final-aux")
Converter = Callable[[str, "list[int] | None"], Path]


@pytest.fixture(scope="module")
def committed() -> Bundle:
    return load_bundle(default_bundle_path())


@pytest.fixture(scope="module")
def convert(committed: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Converter:
    """speculators' Eagle3Converter on a bundle draft (ids: the `--eagle-aux-hidden-state-layer-ids`
    it is told, None = not told), once per request; the converted folder."""
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    done: dict[tuple[str, Any], Path] = {}

    def run(draft: str, ids: list[int] | None) -> Path:
        key = (draft, None if ids is None else tuple(ids))
        if key not in done:
            out = tmp_path_factory.mktemp(f"speculators-{draft}")
            Eagle3Converter().convert(str(committed.draft_dir(draft)), str(out), str(committed.target_dir),
                                      validate=True, eagle_aux_hidden_state_layer_ids=ids)
            done[key] = out
        return done[key]

    return run


def _config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


# --- config parsing --------------------------------------------------------------------------

@pytest.mark.parametrize("ids", [(2, 4, 5), (0, 4, 8), (3,), (1, 7)])
def test_speculators_parses_the_harness_speculators_layout(committed: Bundle, tmp_path: Path,
                                                          ids: tuple[int, ...]) -> None:
    """The harness writes speculators-layout drafts for the layer-id checks (draft_factory
    TOP_LEVEL). speculators' own config parsing must read them as an EAGLE-3 speculator with
    the same top-level ids and the same meaning of every field the harness relies on: the
    residual added before the hidden norm (norm_before_residual False), logits from the normed
    state with the pre-norm state fed back (norm_output False), the llama layer's shapes."""
    from speculators import SpeculatorModelConfig

    folder = DraftFactory(committed, tmp_path).folder(ids, TOP_LEVEL)
    parsed = SpeculatorModelConfig.from_pretrained(str(folder))
    ours = DraftConfig.from_json(_config(folder))
    layer = parsed.transformer_layer_config
    got = {"type": type(parsed).__name__, "ids": tuple(parsed.eagle_aux_hidden_state_layer_ids),
           "norm_before_residual": parsed.norm_before_residual, "norm_output": parsed.norm_output,
           "norm_before_fc": parsed.norm_before_fc, "fc_norm": parsed.fc_norm,
           "draft_vocab_size": parsed.draft_vocab_size, "target_hidden_size": parsed.target_hidden_size,
           "hidden_size": layer.hidden_size, "heads": layer.num_attention_heads,
           "kv_heads": layer.num_key_value_heads, "head_dim": layer.head_dim,
           "intermediate_size": layer.intermediate_size, "rms_norm_eps": layer.rms_norm_eps}
    want = {"type": "Eagle3SpeculatorConfig", "ids": ids, "norm_before_residual": False,
            "norm_output": False, "norm_before_fc": ours.norm_before_fc, "fc_norm": ours.fc_norm,
            "draft_vocab_size": ours.draft_vocab_size, "target_hidden_size": ours.target_hidden_size,
            "hidden_size": ours.hidden_size, "heads": ours.num_attention_heads,
            "kv_heads": ours.num_key_value_heads, "head_dim": ours.head_dim,
            "intermediate_size": ours.intermediate_size, "rms_norm_eps": ours.rms_norm_eps}
    differ = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not differ, (f"speculators {SPECULATORS_VERSION} parses the harness's speculators-layout "
                        f"config for ids {ids} otherwise than the harness means it "
                        f"(field: (speculators, harness)): {differ}")


# --- the converter ---------------------------------------------------------------------------

@pytest.mark.parametrize("draft", THREE_SLOT_DRAFTS)
def test_converter_drops_the_nested_ids(committed: Bundle, convert: Converter, draft: str) -> None:
    """Not told the ids, speculators 0.9.0's converter writes `eagle_aux_hidden_state_layer_ids:
    null`, although the SpecForge draft carries them in `eagle_config`: vLLM then captures its
    defaults. The harness must refuse such a draft, saying what to add, never guess."""
    from speculators import SpeculatorModelConfig

    folder = convert(draft, None)
    assert SpeculatorModelConfig.from_pretrained(str(folder)).eagle_aux_hidden_state_layer_ids is None, (
        f"speculators' converter now keeps draft {draft}'s nested ids "
        f"{list(committed.draft(draft).layer_ids)}: update DESIGN.md 'speculators' and this test")
    with pytest.raises(ValueError, match="add the ids training used"):
        DraftConfig.from_json(_config(folder))


@pytest.mark.parametrize("draft", ["specforge-default", "final-aux"])
def test_verbatim_ids_are_one_boundary_early_in_vllm(committed: Bundle, convert: Converter, draft: str) -> None:
    """Told the training ids verbatim (SpecForge's [1, 3, 4]: b = id + 1), the converter copies
    them to the top level, where vLLM reads b = id: every slot one boundary early, the bug class
    of the motivating case, moved into the conversion. The harness must read them so."""
    spec = committed.draft(draft)
    folder = convert(draft, list(spec.layer_ids))
    ids = DraftConfig.from_json(_config(folder)).aux_layer_ids
    served = ids_to_boundaries(ids, VLLM, committed.num_layers)
    offsets = {s - t for s, t in zip(served, spec.boundaries, strict=True)}
    assert offsets == {-1}, (f"draft {draft}: converted ids {list(ids)} mean boundaries {served} to "
                             f"vLLM, training used {spec.boundaries}; expected every slot one early "
                             f"(offset -1), found offsets {sorted(offsets)}")


def test_embed_first_has_no_vllm_ids(committed: Bundle) -> None:
    """embed-first was trained on boundary 0; vLLM's deepseek_v2 cannot capture it (id 0 is a
    TypeError there), so no ids exist to give the converter and the harness must say so."""
    with pytest.raises(LayerIdError, match="cannot capture boundary 0"):
        boundaries_to_ids(committed.draft("embed-first").boundaries, VLLM, committed.num_layers)


@pytest.mark.parametrize("view", list(PERTURBATIONS.values()), ids=lambda v: v.name)
@pytest.mark.parametrize("draft", ["specforge-default", "final-aux"])
def test_converted_draft_runs_as_trained(committed: Bundle, convert: Converter, draft: str, view: HarnessView) -> None:
    """Converted with the ids that say its training boundaries to vLLM (b = id), the draft
    loads natively in the harness with every weight of the source unchanged and its config's
    fields equal; fed the golden features at the boundaries its converted ids mean (view.read
    under vLLM's rule) through the harness's TTT forward, it predicts the golden draft tokens
    at every position and step of every pinned prompt."""
    spec = committed.draft(draft)
    ids = list(boundaries_to_ids(spec.boundaries, VLLM, committed.num_layers))
    folder = convert(draft, ids)
    problems: list[str] = []
    source = load_file(str(committed.draft_dir(draft) / "model.safetensors"))
    converted = speculators_keys(load_file(str(folder / "model.safetensors")))
    for key, tensor in source.items():
        if key not in converted or not torch.equal(converted[key], tensor):
            problems.append(f"weight {key}: {'missing' if key not in converted else 'changed'} "
                            f"after conversion")
    ours, theirs = (DraftConfig.from_json(json.loads((f / "config.json").read_text()))
                    for f in (committed.draft_dir(draft), folder))
    for field in ("vocab_size", "draft_vocab_size", "hidden_size", "target_hidden_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta",
                  "norm_before_fc", "fc_norm"):
        if getattr(ours, field) != getattr(theirs, field):
            problems.append(f"config {field}: {getattr(ours, field)} in the source, "
                            f"{getattr(theirs, field)} after conversion")
    draft_model = Eagle3Draft.load(folder)
    project = draft_model.project
    draft_model.project = lambda a: view.project(project, draft_model.cfg.hidden_size, a)  # type: ignore[method-assign]
    served = view.read(theirs.aux_layer_ids, VLLM, committed.num_layers)
    golden_tokens = committed.tensors[f"{draft}.draft_tokens"]
    differ = total = 0
    for i, prompt in enumerate(committed.prompts()):
        t = len(prompt)
        if t < 2:
            continue
        feats = committed.tensors["boundaries"][i, :, :t]
        aux = torch.cat([feats[b] for b in served], -1)
        labels = torch.zeros(1, t, dtype=torch.long)  # labels only score accuracy, not read here
        with torch.no_grad():
            _, _, preds = ttt_forward(draft_model, torch.tensor([prompt]), aux[None], labels)
        for j, pred in enumerate(preds):
            got = draft_model.to_target_ids(pred[0])
            want = golden_tokens[i, : got.shape[0], j]
            differ += int((got != want).sum())
            total += got.shape[0]
    if differ:
        problems.append(f"{differ} of {total} TTT predictions of the converted draft (ids {list(theirs.aux_layer_ids)} "
                        f"-> boundaries {served} under vLLM's rule) differ from the golden draft tokens")
    judged(view, problems, f"draft {draft} through speculators' converter")
