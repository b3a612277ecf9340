"""Runs llama.cpp's own `convert_hf_to_gguf.py` from its sources, as a script:
`python tests/llamacpp_convert_run.py <llama.cpp sources> <its arguments>` (for
tests/test_convert_check_real.py).

One thing is changed, and only the vocabulary: the bundle's target ships no tokenizer (the suite
speaks token ids), and a draft converted with --target-model-dir takes its vocabulary from the
target, so the model class the converter picks writes the converter's own "no vocabulary"
(`_set_vocab_none`) instead of failing. convert-check reads no vocabulary; the ids, the tensors
and their types are the converter's untouched output.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> None:
    src, args = Path(argv[0]).resolve(), argv[1:]
    sys.path.insert(0, str(src))
    sys.path.insert(1, str(src / "gguf-py"))  # the sources' gguf-py knows the eagle3 architecture
    import conversion  # llama.cpp's converter package, from `src`

    original = conversion.get_model_class

    def without_vocabulary(*a: Any, **k: Any) -> type:
        cls = original(*a, **k)
        return type(cls.__name__, (cls,), {"set_vocab": cls._set_vocab_none, "model_arch": cls.model_arch})

    conversion.get_model_class = without_vocabulary
    script = src / "convert_hf_to_gguf.py"
    sys.argv = [str(script), *args]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
