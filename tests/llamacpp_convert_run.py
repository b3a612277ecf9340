"""Runs llama.cpp's own `convert_hf_to_gguf.py` from its sources, as a script:
`python tests/llamacpp_convert_run.py <llama.cpp sources> <its arguments>` (for
tests/test_convert_check_real.py). The one copy of how it is run, vocabulary patch included,
is `harness.engines._llamacpp_convert` (the `llamacpp` adapter converts with it too).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.engines._llamacpp_convert import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:])
