"""One vLLM engine in a process of its own, driven over a pipe by `harness.engines.vllm`
(the process machinery is `harness.engines._worker`, shared with SGLang).

Why in-process *inside* that process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the probe on the
drafter's `combine_hidden_states` has to live in the same interpreter as the model runner.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any, ClassVar

from harness.engines import _worker
from harness.engines._worker import WorkerError

__all__ = ["KV_CACHE_BYTES", "WorkerError", "WorkerHandle", "serve"]

# Enough KV cache for the suite's prompts on any device. Without it vLLM on CPU reserves a
# fraction of the NUMA node (and refuses to start when that much is not free), and on a GPU
# two workers (speculative and plain) could not both take vLLM's default 92%.
KV_CACHE_BYTES = 512 << 20
# --------------------------------------------------------------------------------------
# child side
# --------------------------------------------------------------------------------------

class _Server:
    """The live engine plus a probe on its drafter. Methods named like the ops are what the
    parent may call."""

    def __init__(self, spec: dict[str, Any]) -> None:
        _request_amx()
        import vllm
        from vllm import LLM

        self.spec = spec
        self.speculative = spec["draft_dir"] is not None
        self.records: list[dict[str, Any]] = []
        self.recording = False
        # decode_inputs: one dict per propose() call (a feed), filled by the three wrappers
        self.feeds: list[dict[str, Any]] | None = None
        kwargs: dict[str, Any] = dict(
            model=spec["target_dir"], dtype=spec["dtype"], seed=spec["seed"],
            max_model_len=spec["max_model_len"], max_num_batched_tokens=max(
                spec["max_model_len"], 2048),
            skip_tokenizer_init=True,  # token-id prompts: the folders carry no tokenizer
            enforce_eager=True,  # start-up in seconds; the suite's models are tiny
            enable_prefix_caching=False,  # a cached prefix would shrink the prefill we probe
            disable_log_stats=False,  # acceptance counters come from the stats loggers
            kv_cache_memory_bytes=KV_CACHE_BYTES,
        )
        if self.speculative:
            kwargs["speculative_config"] = {
                "method": "eagle3", "model": spec["draft_dir"],
                "num_speculative_tokens": spec["num_draft_tokens"]}
            kwargs["per_request_spec_decode_metrics"] = "detailed"
        kwargs.update(spec.get("engine_args", {}))
        started = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.info: dict[str, Any] = {
            "vllm_version": vllm.__version__,
            "startup_s": time.perf_counter() - started,
            "env": {k: os.environ.get(k) for k in ("VLLM_MLA_DISABLE", "VLLM_USE_V2_MODEL_RUNNER")},
            "engine_args": spec.get("engine_args", {}),
        }
        self.info.update(self.llm.collective_rpc(self._install)[0])

    def _install(self, worker: Any) -> dict[str, Any]:
        """Runs inside vLLM's worker: wrap the drafter's fc entry point and report what the
        engine decided. An instance attribute, because forward hooks on the target never
        fire (vLLM's compile wrapper calls `forward` directly) and the drafter calls this
        method by name on every proposal."""
        inner = getattr(worker, "worker", worker)
        runner = inner.model_runner
        target = runner.get_model()
        holder = getattr(target, "model", target)
        info: dict[str, Any] = {
            "model_runner": f"{type(runner).__module__}.{type(runner).__name__}",
            "aux_hidden_state_layers": list(getattr(holder, "aux_hidden_state_layers", ()) or ()),
        }
        # V1 runner: `drafter`; V2 runner (the GPU default where Triton is present): `speculator`.
        proposer = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
        drafter = getattr(proposer, "model", None)
        if drafter is None or not hasattr(drafter, "combine_hidden_states"):
            return info
        info["drafter"] = type(drafter).__name__
        original = drafter.combine_hidden_states

        def combine_hidden_states(hidden: Any) -> Any:
            if self.feeds:
                self.feeds[-1]["in"] = hidden.detach().float().cpu().clone()
            if not self.recording:
                return original(hidden)
            record = {"in": hidden.detach().float().cpu().clone(), "out": None}
            self.records.append(record)
            out = original(hidden)
            record["out"] = out.detach().float().cpu().clone()
            return out

        drafter.combine_hidden_states = combine_hidden_states
        self._install_feed_probe(proposer, drafter)
        return info

    def _install_feed_probe(self, proposer: Any, drafter: Any) -> None:
        """For decode_inputs: around each `propose` (one feed: the prefill, or the verify
        round's k + 1 rows of which vLLM's padded drafter batch treats the rejected drafts
        as padding), record the positions and the count of padding rows; the drafter's
        forwards after the first in that call are the drafted steps, whose positions are
        recorded too. The features are recorded by the combine_hidden_states probe."""
        original_propose, original_forward = proposer.propose, drafter.forward

        def propose(*args: Any, **kwargs: Any) -> Any:
            if self.feeds is not None:
                if "target_positions" not in kwargs:
                    raise RuntimeError("vLLM called the drafter's propose without keyword "
                                       "target_positions: the decode-input probe cannot read it")
                rejected = kwargs.get("num_rejected_tokens_gpu")
                self.feeds.append({
                    "positions": [int(p) for p in kwargs["target_positions"].reshape(-1).tolist()],
                    "padding": int(rejected.sum()) if rejected is not None else 0,
                    "in": None, "forwards": 0, "steps": []})
            return original_propose(*args, **kwargs)

        def forward(*args: Any, **kwargs: Any) -> Any:
            if self.feeds:
                feed = self.feeds[-1]
                feed["forwards"] += 1
                positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
                if feed["forwards"] > 1 and positions is not None:
                    feed["steps"].append(int(positions.reshape(-1)[0]))
            return original_forward(*args, **kwargs)

        proposer.propose = propose
        drafter.forward = forward

    def decode_inputs(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                      out_path: str) -> dict[str, Any]:
        """One prompt per request, greedy: every feed of target features to the drafter with
        its positions (padding rows dropped) and the drafted steps' positions; the rows go to
        `out_path` (safetensors), the rest back over the pipe."""
        from safetensors.torch import save_file
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True,
                                detokenize=False)
        tensors: dict[str, Any] = {}
        prompts_out: list[dict[str, Any]] = []
        for i, prompt in enumerate(prompts):
            self.feeds = []
            try:
                out = self.llm.generate([{"prompt_token_ids": list(prompt)}], params, use_tqdm=False)
                feeds = self.feeds
            finally:
                self.feeds = None
            meta = []
            for r, feed in enumerate(feeds):
                if feed["in"] is None:
                    raise RuntimeError("vLLM's propose ran without calling combine_hidden_states: "
                                       "no EAGLE-3 fc input to record")
                rows = len(feed["positions"]) - feed["padding"]
                tensors[f"feed.{i}.{r}"] = feed["in"][:rows].contiguous()
                meta.append({"positions": feed["positions"][:rows], "steps": feed["steps"]})
            prompts_out.append({"tokens": list(out[0].outputs[0].token_ids), "feeds": meta})
        save_file(tensors, out_path)
        return {"path": out_path, "prompts": prompts_out}

    def capture(self, prompts: Sequence[Sequence[int]], out_path: str) -> dict[str, Any]:
        """One prompt per step so the drafter's first call is exactly that prompt's prefill
        (no batch to split back, no scheduler order to trust); one new token is enough for
        the drafter to run once. If vLLM fails, what the probe saw so far is still written:
        a crash in fc on a too-narrow input is itself the evidence."""
        from safetensors.torch import save_file
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
        tensors: dict[str, Any] = {}
        for i, prompt in enumerate(prompts):
            self.records.clear()
            self.recording = True
            try:
                self.llm.generate([{"prompt_token_ids": list(prompt)}], params, use_tqdm=False)
            except BaseException:
                if self.records:  # the probe saw the features before the drafter failed on them
                    tensors[f"features.{i}"] = self.records[0]["in"]
                save_file(tensors, out_path)
                raise
            finally:
                self.recording = False
            if not self.records:
                raise RuntimeError("vLLM never called the drafter's combine_hidden_states "
                                   "during prefill: no EAGLE-3 fc input to capture")
            first = self.records[0]
            if first["in"].shape[0] != len(prompt):
                raise RuntimeError(f"drafter's first call had {first['in'].shape[0]} rows for "
                                   f"a {len(prompt)}-token prompt (prefill was split)")
            tensors[f"features.{i}"] = first["in"]
            tensors[f"fc_out.{i}"] = first["out"]
        save_file(tensors, out_path)
        return {"path": out_path, "count": len(prompts)}

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> dict[str, Any]:
        """Greedy, exactly `max_new_tokens` each (ignore_eos: the reference stops on length
        only), acceptance as counter deltas around the call."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True,
                                detokenize=False)
        before = self._counters()
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params,
                                 use_tqdm=False)
        after = self._counters()
        result: dict[str, Any] = {"tokens": [list(o.outputs[0].token_ids) for o in outs]}
        if self.speculative:
            result["acceptance"] = {k: _minus(after.get(k, 0), before.get(k, 0))
                                    for k in set(after) | set(before)}
            result["per_prompt"] = [_request_metrics(o.outputs[0]) for o in outs]
        return result

    def _counters(self) -> dict[str, Any]:
        totals: dict[str, Any] = {}
        for metric in self.llm.get_metrics():
            if not metric.name.startswith("vllm:spec_decode_"):
                continue
            key = metric.name.removeprefix("vllm:spec_decode_")
            values = getattr(metric, "values", None)
            if values is not None:
                old = totals.get(key, [])
                width = max(len(old), len(values))
                totals[key] = [(old[i] if i < len(old) else 0) + (values[i] if i < len(values) else 0)
                               for i in range(width)]
            else:
                totals[key] = totals.get(key, 0) + int(getattr(metric, "value", 0))
        return totals


def _minus(a: Any, b: Any) -> Any:
    if isinstance(a, list) or isinstance(b, list):
        a, b = list(a or []), list(b or [])
        width = max(len(a), len(b))
        return [int((a[i] if i < len(a) else 0) - (b[i] if i < len(b) else 0)) for i in range(width)]
    return int(a - b)


def _request_metrics(completion: Any) -> dict[str, Any] | None:
    metrics = getattr(completion, "spec_decode_metrics", None)
    if metrics is None:
        return None
    return {"histogram": list(metrics.histogram), "num_draft_tokens": int(metrics.num_draft_tokens),
            "per_step_accepted": list(metrics.per_step_accepted)}


def _request_amx() -> bool:
    """Ask Linux for the AMX tile state before vLLM runs anything. A process must request it
    (arch_prctl ARCH_REQ_XCOMP_PERM, which torch's `_init_amx` does) before its first AMX
    instruction, or the kernel kills it with SIGILL. vLLM 0.32 on a CPU with AMX runs small
    bf16 GEMMs (a draft's fc, the MoE router) through its own sgl-kernel `weight_packed_linear`,
    which does not ask: on an Intel Xeon (2026-12-03) every draft of the suite's draft factory
    (the bundle's drafts with ids rewritten and fc redrawn) died of signal 4 at its first
    capture, while the bundle's own drafts served (which kernel asked first there was not
    traced). False where the CPU has no AMX or torch has no such call."""
    import torch

    init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    return bool(init()) if init is not None and torch.cpu._is_amx_tile_supported() else False


def serve(conn: Connection) -> None:
    _worker.serve(conn, _Server)


class WorkerHandle(_worker.WorkerHandle):
    """A started vLLM worker."""

    module: ClassVar[str] = "harness.engines._vllm_worker"
    label: ClassVar[str] = "vLLM"
    forced_env: ClassVar[dict[str, str]] = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
