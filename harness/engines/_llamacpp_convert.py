"""llama.cpp's own `convert_hf_to_gguf.py`, run from its sources: how the `llamacpp` adapter
turns the bundle's HF folders into the GGUF files llama.cpp serves, and how convert-check's
real-converter tests (tests/test_convert_check_real.py) run it. One copy, here.

As a script: `python -m harness.engines._llamacpp_convert <llama.cpp sources> [--vocab-test N]
<the converter's own arguments>`.

One thing is changed, and only the vocabulary: the bundle's target ships no tokenizer (the suite
speaks token ids), and a draft converted with --target-model-dir takes its vocabulary from the
target, so the model class the converter picks writes instead:

- by default the converter's own "no vocabulary" (`_set_vocab_none`): what convert-check
  reads, since it reads no vocabulary;
- with `--vocab-test N`, llama.cpp's own test vocabulary (tokenizer model "test": N tokens,
  each id's text its hex digits, the type llama-vocab.cpp detokenises by printing the id):
  llama-server detokenises every generated token and asserts on a model without a vocabulary,
  and its speculative path wants the draft's vocabulary to be the target's, so the adapter
  gives both this one.

The ids, the tensors and their types are the converter's untouched output.
"""

from __future__ import annotations

import hashlib
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["convert", "main"]


def _test_vocab(size: int) -> Any:
    """A `set_vocab` that writes llama.cpp's test vocabulary of `size` tokens."""

    def set_vocab(self: Any) -> None:
        self.gguf_writer.add_tokenizer_model("test")
        self.gguf_writer.add_token_list([f"{i:x}".encode() for i in range(size)])

    return set_vocab


def main(argv: list[str]) -> None:
    """Run the converter of the sources `argv[0]` with the rest of `argv` as its arguments
    (`--vocab-test N` first, if given, is ours)."""
    src, args = Path(argv[0]).resolve(), list(argv[1:])
    vocab_size: int | None = None
    if args[:1] == ["--vocab-test"]:
        vocab_size, args = int(args[1]), args[2:]
    sys.path.insert(0, str(src))
    sys.path.insert(1, str(src / "gguf-py"))  # the sources' gguf-py knows the eagle3 architecture
    import conversion  # llama.cpp's converter package, from `src`

    original = conversion.get_model_class

    def patched_vocabulary(*a: Any, **k: Any) -> type:
        cls = original(*a, **k)
        set_vocab = cls._set_vocab_none if vocab_size is None else _test_vocab(vocab_size)
        return type(cls.__name__, (cls,), {"set_vocab": set_vocab, "model_arch": cls.model_arch})

    conversion.get_model_class = patched_vocabulary
    script = src / "convert_hf_to_gguf.py"
    sys.argv = [str(script), *args]
    runpy.run_path(str(script), run_name="__main__")


def _folder_digest(*folders: Path) -> str:
    """Content digest of the HF folders' config and weights: a converted file is reused only
    for the same bytes (Hypothesis drafts live in fresh temporary folders)."""
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.iterdir()):
            if path.suffix in (".json", ".safetensors") and path.is_file():
                h.update(path.name.encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:20]


def convert(src: Path, folder: Path, out_dir: Path, outtype: str, *,
            target_dir: Path | None = None, vocab_size: int | None = None,
            timeout_s: float = 600.0) -> Path:
    """`folder` (a target, or with `target_dir` an EAGLE-3 draft) as GGUF of `outtype` (f32,
    bf16, f16) in `out_dir`, converted once per content: a second call with the same bytes
    returns the same file. Raises RuntimeError with the converter's last lines where it
    fails (a draft it cannot convert is the engine's failure on that draft)."""
    folders = [folder] + ([target_dir] if target_dir is not None else [])
    key = _folder_digest(*folders)
    out = out_dir / f"{folder.name}-{key}-{outtype}{'-v' if vocab_size else ''}.gguf"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(f".{os.getpid()}.part")
    cmd = [sys.executable, "-m", "harness.engines._llamacpp_convert", str(src)]
    if vocab_size is not None:
        cmd += ["--vocab-test", str(vocab_size)]
    cmd += [str(folder), "--outfile", str(partial), "--outtype", outtype]
    if target_dir is not None:
        cmd += ["--target-model-dir", str(target_dir)]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"llama.cpp's convert_hf_to_gguf.py failed on {folder.name}: {tail}")
    partial.replace(out)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
