"""The training-time oracle: answers "what should the draft have been fed?" for any prompt.

Pinned prompts are answered from the committed tensors (so library drift cannot move the
goalposts); prompts Hypothesis draws are computed on the fly with the bundle's target and
draft in fp32 on the CPU, exactly as the golden builder computed the pinned ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import torch

from harness.golden.bundle import Bundle, DraftSpec
from harness.golden.features import TargetFeatures, target_features
from harness.models.draft import Eagle3Draft
from harness.models.target import load_target, routing_margins


class Oracle:
    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self._cache: dict[tuple[int, ...], TargetFeatures] = {}
        self._drafts: dict[str, Eagle3Draft] = {}
        self._margins: dict[tuple[int, ...], torch.Tensor] = {}
        for i, prompt in enumerate(bundle.prompts()):
            self._cache[tuple(prompt)] = self._pinned(i, len(prompt))

    def _pinned(self, i: int, n: int) -> TargetFeatures:
        t = self.bundle.tensors
        return TargetFeatures(boundaries=t["boundaries"][i, :, :n], final_normed=t["final_normed"][i, :n],
                              mlp_out=t["mlp_out"][i, :, :n], logits=None)

    @cached_property
    def target(self) -> torch.nn.Module:
        return load_target(self.bundle.target_dir, torch.float32, "cpu")

    def draft(self, name: str) -> Eagle3Draft:
        if name not in self._drafts:
            self._drafts[name] = Eagle3Draft.load(self.bundle.draft_dir(name), torch.float32, "cpu")
        return self._drafts[name]

    def spec(self, name: str) -> DraftSpec:
        return self.bundle.draft(name)

    @property
    def pinned_prompts(self) -> list[list[int]]:
        return self.bundle.prompts()

    def features(self, prompt: Sequence[int]) -> TargetFeatures:
        key = tuple(int(t) for t in prompt)
        if key not in self._cache:
            self._cache[key] = target_features(self.target, key)
        return self._cache[key]

    def routing_margins(self, prompt: Sequence[int]) -> torch.Tensor:
        """[N+1, T] fp32 router margins before each boundary (see models.target.routing_margins):
        where a reduced-precision engine may flip an expert and still be conformant."""
        key = tuple(int(t) for t in prompt)
        if key not in self._margins:
            self._margins[key] = routing_margins(self.target, list(key))
        return self._margins[key]

    @torch.no_grad()
    def fc(self, draft: str, features: torch.Tensor) -> torch.Tensor:
        """The trained fc (with its norms) on given features, in fp32."""
        return self.draft(draft).project(features.float())

    @torch.no_grad()
    def top2_margin(self, tokens: Sequence[int]) -> float:
        """fp32 logit gap between the best and second-best next token after `tokens`: a
        divergence there is a near-tie that reduced precision may legitimately flip."""
        logits = self.target(input_ids=torch.tensor([list(tokens)])).logits[0, -1].float()
        top = torch.topk(logits, 2).values
        return float(top[0] - top[1])
