"""The harness as is and deliberately broken, for checks against real trainers and converters
(issue #36): a check that still passes against a broken harness cannot tell that bug, so each
such check runs against every view here and must fail on the perturbed ones."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from harness.core.boundaries import get_convention, ids_to_boundaries
from harness.golden.bundle import Bundle


@dataclass(frozen=True)
class HarnessView:
    """What the harness says about a draft: the boundaries its ids mean, and the reference
    draft's fc projection. A perturbation replaces one of them by a known wiring bug."""

    name: str
    shift: int = 0  # every boundary moved by this many (the sign flips where it would leave 0..N)
    fc_skipped: bool = False  # the first slot fed unprojected (a width-comparing engine's bug)

    def boundaries(self, bundle: Bundle, draft: str) -> tuple[int, ...]:
        """The boundaries the harness assigns to a bundle draft's ids (its manifest convention)."""
        spec = bundle.draft(draft)
        return self.read(spec.layer_ids, spec.convention, bundle.num_layers)

    def read(self, ids: Sequence[int], convention: str, num_layers: int) -> tuple[int, ...]:
        """The boundaries the harness assigns to `ids` under `convention`."""
        got = tuple(ids_to_boundaries(ids, get_convention(convention), num_layers))
        if not self.shift:
            return got
        step = self.shift if all(0 <= b + self.shift <= num_layers for b in got) else -self.shift
        return tuple(b + step for b in got)

    def project(self, project: Callable[[torch.Tensor], torch.Tensor], hidden_size: int,
                aux: torch.Tensor) -> torch.Tensor:
        """The reference draft's fc (`project`) on aux, or the perturbation's stand-in."""
        if self.fc_skipped:
            return aux[..., :hidden_size]
        return project(aux)


PERTURBATIONS = {
    "as-is": HarnessView("as-is"),
    "fc-skipped": HarnessView("fc-skipped", fc_skipped=True),
    "boundary-shifted": HarnessView("boundary-shifted", shift=1),
}


def judged(view: HarnessView, problems: list[str], what: str) -> None:
    """As-is: no problem may be found. Perturbed: some must be, or this check cannot tell."""
    if view.name == "as-is":
        assert not problems, f"{what}: SpecForge and the harness differ:\n" + "\n".join(problems)
    else:
        assert problems, (f"{what}: the harness perturbed by '{view.name}' still matched "
                          f"SpecForge, so this check cannot tell that bug")


