"""One `sglang.Engine` in a process of its own, driven over a pipe by `harness.engines.sglang`
(the process machinery is `harness.engines._worker`).

Why a process: SGLang's Engine runs its scheduler in child processes and, when one of them
dies (which a draft the suite is meant to break provokes), signals its parent; that parent
must be this worker, not the test session. The fc-input recorder (`_sglang_models`) runs
inside SGLang's scheduler process; it writes a safetensors file per draft forward into the
capture folder while the flag file `recording` exists there, so this process switches it
on around exactly one prompt's prefill.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

from harness.engines import _worker
from harness.engines._worker import WorkerError

__all__ = ["WorkerError", "WorkerHandle", "serve"]

RECORDING_FLAG = "recording"


class _Server:
    def __init__(self, spec: dict[str, Any]) -> None:
        import sglang

        self.spec = spec
        self.capture_dir = Path(spec["capture_dir"]) if spec["capture_dir"] else None
        started = time.perf_counter()
        self.engine = sglang.Engine(**spec["engine_args"])
        self.info: dict[str, Any] = {
            "sglang_version": sglang.__version__,
            "startup_s": time.perf_counter() - started,
            "engine_args": spec["engine_args"],
        }

    def capture(self, prompts: Sequence[Sequence[int]], out_path: str) -> dict[str, Any]:
        """One prompt per request, one new token: the draft's first forward after the target's
        prefill (the draft extend) is handed that prompt's aux states, one row per token. If
        SGLang fails, what the recorder saw so far is still written."""
        from safetensors.torch import load_file, save_file

        from harness.engines._sglang_protocol import sampling_params

        if self.capture_dir is None:
            raise RuntimeError("capture needs the speculative engine")
        flag = self.capture_dir / RECORDING_FLAG
        tensors: dict[str, Any] = {}
        for i, prompt in enumerate(prompts):
            for old in self.capture_dir.glob("*.safetensors"):
                old.unlink()
            flag.touch()
            try:
                self.engine.generate(input_ids=list(prompt), sampling_params=sampling_params(1))
            except BaseException:
                records = sorted(self.capture_dir.glob("*.safetensors"))
                if records:  # the recorder saw the features before the draft failed on them
                    tensors[f"features.{i}"] = load_file(str(records[0]))["in"]
                save_file(tensors, out_path)
                raise
            finally:
                flag.unlink(missing_ok=True)
            records = sorted(self.capture_dir.glob("*.safetensors"))
            if not records:
                raise RuntimeError("SGLang never ran the EAGLE-3 draft during prefill: no fc "
                                   "input to capture (was the recording model class used?)")
            first = load_file(str(records[0]))
            if first["in"].shape[0] != len(prompt):
                raise RuntimeError(f"the draft's first forward had {first['in'].shape[0]} rows "
                                   f"for a {len(prompt)}-token prompt (prefill was split)")
            tensors[f"features.{i}"] = first["in"]
            if "out" in first:
                tensors[f"fc_out.{i}"] = first["out"]
        save_file(tensors, out_path)
        return {"path": out_path, "count": len(prompts)}

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> dict[str, Any]:
        """Greedy, exactly `max_new_tokens` each; each request's meta_info keys the adapter
        reads."""
        from harness.engines._sglang_protocol import META_KEYS, OUTPUT_IDS, sampling_params

        outs = self.engine.generate(input_ids=[list(p) for p in prompts],
                                    sampling_params=sampling_params(max_new_tokens))
        return {"tokens": [list(o[OUTPUT_IDS]) for o in outs],
                "meta": [{k: o["meta_info"][k] for k in META_KEYS if k in o["meta_info"]}
                         for o in outs]}


def serve(conn: Connection) -> None:
    _worker.serve(conn, _Server)


class WorkerHandle(_worker.WorkerHandle):
    """A started SGLang worker."""

    module: ClassVar[str] = "harness.engines._sglang_worker"
    label: ClassVar[str] = "SGLang"


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
