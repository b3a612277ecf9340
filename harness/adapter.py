"""Everything an engine adapter needs, in one import: the public API of docs/ADAPTERS.md.

An adapter is written against this module and nothing else of the package, so the
package's inside can be rearranged without breaking a vendor's adapter: the base class and
its data types (what `capture`, `generate` and `decode_inputs` return), the two exceptions
that tell the suite "this engine cannot run here" from "this engine failed", the layer-id
convention an adapter declares for its engine, and the reading of the draft config's ids
the way engines read them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.core.boundaries import Convention, LayerIdError, ids_to_boundaries
from harness.engines.base import (
    Acceptance,
    Capability,
    Capture,
    DecodeInputs,
    DraftFeed,
    Engine,
    EngineCrash,
    EngineOptions,
    EngineUnavailable,
    Generation,
)

__all__ = [
    "IDS", "Acceptance", "Capability", "Capture", "Convention", "DecodeInputs", "DraftFeed",
    "Engine", "EngineCrash", "EngineOptions", "EngineUnavailable", "Generation",
    "LayerIdError", "config_layer_ids", "ids_to_boundaries",
]

IDS = "eagle_aux_hidden_state_layer_ids"  # the draft config key that holds the layer ids


def config_layer_ids(draft_dir: str | Path) -> list[int] | None:
    """The layer ids in a draft folder's config.json, in either layout a trainer writes:
    SpecForge nests them under `eagle_config`, speculators writes them at the top level
    (the nested list first where both are present; an engine that reads only one of them
    reads that key itself). None where the config holds none: engines then use their own
    default ids."""
    config: dict[str, Any] = json.loads((Path(draft_dir) / "config.json").read_text())
    nested = config.get("eagle_config")
    if isinstance(nested, dict) and IDS in nested:
        return list(nested[IDS])
    return list(config[IDS]) if IDS in config else None
