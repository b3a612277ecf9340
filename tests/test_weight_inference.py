"""Weight inference (harness.weight_inference) on the committed target: right, and never a
confident wrong answer. On every bundle draft the answer is its training boundaries, beyond
the ambiguity threshold (the bundle's drafts depend on their aux features: issue #10, the
README's figures); on untrained drafts (random weights, the bundle draft's vocab map) it must
be "ambiguous" every time — a confident answer there would be noise taken for evidence.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from harness.golden.features import target_features
from harness.models.draft import Eagle3Draft
from harness.models.target import load_target
from harness.paths import default_bundle_path
from harness.weight_inference import greedy_prompts, infer_boundaries

BUNDLE = default_bundle_path()
SEED_LEN = 8
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference():
    target = load_target(BUNDLE / "target")
    gen = torch.Generator().manual_seed(0)
    seeds = [torch.randint(3, 512, (SEED_LEN,), generator=gen).tolist() for _ in range(8)]
    prompts = greedy_prompts(target, seeds, 16)
    return target, prompts, [target_features(target, p) for p in prompts]


def _load(name: str, target) -> Eagle3Draft:
    folder = BUNDLE / f"draft-{name}"
    draft = Eagle3Draft.load(folder)
    if "embed_tokens.weight" not in load_file(str(folder / "model.safetensors")):
        draft.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
    return draft


@pytest.mark.parametrize("name", sorted(json.loads((BUNDLE / "manifest.json").read_text())["drafts"]))
def test_bundle_draft_inferred_right(reference, name) -> None:
    target, prompts, feats = reference
    trained = json.loads((BUNDLE / "manifest.json").read_text())["drafts"][name]["boundaries"]
    inf = infer_boundaries(_load(name, target), prompts, feats, score_from=SEED_LEN)
    print(f"{name} (trained {trained}): {inf.line()}")
    assert not inf.ambiguous and inf.boundaries == trained, inf.line()
    assert inf.tokens == len(prompts) * (len(prompts[0]) - SEED_LEN)


def test_untrained_drafts_are_ambiguous(reference) -> None:
    target, prompts, feats = reference
    base = _load("specforge-default", target)
    lines = []
    for seed in range(10):
        torch.manual_seed(100 + seed)
        draft = Eagle3Draft(base.cfg)
        draft.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
        draft.d2t.copy_(base.d2t)
        draft.t2d.copy_(base.t2d)
        inf = infer_boundaries(draft.eval(), prompts, feats, score_from=SEED_LEN)
        lines.append(f"random draft {seed}: {inf.line()}")
    print("\n".join(lines))
    assert all("ambiguous" in line for line in lines), lines
