"""The training-time oracle: answers "what should the draft have been fed?" for any prompt.

Pinned prompts are answered from the committed tensors (so library drift cannot move the
goalposts); prompts Hypothesis draws are computed on the fly with the bundle's target and
draft in fp32 on the CPU, exactly as the golden builder computed the pinned ones.

For an engine in reduced precision it also answers "how far may a correct engine in that
dtype be from the training computation?": the precision envelope of the prompt
(harness/golden/envelope.py), the same target run by several correct implementations in that
dtype (harness/models/variants.py; on the CPU, and on the GPU where one is present), built
once per session and prompt, lazily, only when asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import torch

from harness.golden.bundle import Bundle, DraftSpec
from harness.golden.envelope import Envelope, EnvelopeBuilder
from harness.golden.features import TargetFeatures, target_features
from harness.models.draft import Eagle3Draft
from harness.models.target import load_target
from harness.models.variants import FC_MEMBERS, Implementation, apply_choices


class Oracle:
    def __init__(self, bundle: Bundle, members: Sequence[Implementation] | None = None,
                 placement: str | None = None) -> None:
        """`members`: the implementations precision envelopes are made of (default: every
        variant on the CPU and, where torch sees a GPU, the defaults and the composites there).
        `placement`: the fp32 target spread over the processes of a torchrun launch
        (harness.models.placement; every rank answers alike), for a target one device cannot
        hold; None: the whole target in this process."""
        self.bundle = bundle
        self.placement = placement
        self._members = members
        self._cache: dict[tuple[int, ...], TargetFeatures] = {}
        self._drafts: dict[str, Eagle3Draft] = {}
        self._targets: dict[tuple[str, str], torch.nn.Module] = {}
        self._low_drafts: dict[tuple[str, str, str], Eagle3Draft] = {}
        for i, prompt in enumerate(bundle.prompts()):
            self._cache[tuple(prompt)] = self._pinned(i, len(prompt))

    def _pinned(self, i: int, n: int) -> TargetFeatures:
        t = self.bundle.tensors
        return TargetFeatures(boundaries=t["boundaries"][i, :, :n], final_normed=t["final_normed"][i, :n],
                              mlp_out=t["mlp_out"][i, :, :n], logits=None)

    @cached_property
    def target(self) -> torch.nn.Module:
        return load_target(self.bundle.target_dir, torch.float32, "cpu", self.placement)

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

    def _reference(self, dtype: str, device: str) -> torch.nn.Module:
        key = (dtype, device)
        if key not in self._targets:
            self._targets[key] = load_target(self.bundle.target_dir, getattr(torch, dtype), device)
        return self._targets[key]

    def _reference_draft(self, name: str, dtype: str, impl: Implementation) -> Eagle3Draft:
        key = (name, dtype, impl.name)
        if key not in self._low_drafts:
            model = Eagle3Draft.load(self.bundle.draft_dir(name), getattr(torch, dtype), impl.device)
            apply_choices(model, impl, getattr(torch, dtype))
            self._low_drafts[key] = model
        return self._low_drafts[key]

    @cached_property
    def envelopes(self) -> EnvelopeBuilder:
        return EnvelopeBuilder(self.bundle.target_dir, self.target, self._members)

    def envelope(self, prompt: Sequence[int], dtype: str) -> Envelope:
        """The precision envelope of `prompt` in `dtype` (harness/golden/envelope.py): what a
        correct engine in that dtype may differ from training by. Cached per prompt."""
        return self.envelopes.envelope(prompt, dtype)

    @torch.no_grad()
    def reference_fc(self, draft: str, features: torch.Tensor, dtype: str,
                     without: str | None = None) -> torch.Tensor:
        """[M, T, H]: the trained fc on given features computed in `dtype` by each correct
        implementation of it (harness.models.variants.FC_MEMBERS, on the CPU and, where
        present, the GPU), back in fp32 on the CPU: the fc check's precision envelope;
        `without`: a member left out (the leave-one-out control)."""
        out = []
        for impl in self.envelopes.members:
            if impl.name.partition("@")[0] in FC_MEMBERS and impl.name != without:
                model = self._reference_draft(draft, dtype, impl)
                low = features.to(device=impl.device, dtype=getattr(torch, dtype))
                out.append(model.project(low).float().cpu())
        return torch.stack(out)

    @torch.no_grad()
    def reference_logits(self, tokens: Sequence[int], dtype: str, device: str) -> torch.Tensor:
        """Next-token logits after `tokens` of the target in `dtype` on `device`, fp32 on the CPU."""
        model = self._reference(dtype, device)
        ids = torch.tensor([list(tokens)], device=device)
        return model(input_ids=ids).logits[0, -1].float().cpu()

    @torch.no_grad()
    def fc(self, draft: str, features: torch.Tensor) -> torch.Tensor:
        """The trained fc (with its norms) on given features, in fp32."""
        return self.draft(draft).project(features.float())

    @torch.no_grad()
    def top2_logits(self, tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(fp32 logits after `tokens`, indices of the best two): a divergence there is a
        near-tie when reduced precision can move the gap between those two by as much."""
        logits = self.target(input_ids=torch.tensor([list(tokens)])).logits[0, -1].float()
        return logits, torch.topk(logits, 2).indices

    def top2_margin(self, tokens: Sequence[int]) -> float:
        """fp32 logit gap between the best and second-best next token after `tokens`."""
        logits, top = self.top2_logits(tokens)
        return float(logits[top[0]] - logits[top[1]])
