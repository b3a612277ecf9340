"""`eagle3-conformance doctor`: one target and one draft on disk, no golden bundle.

Checks every input before any work (report folder, configs, ids, prompts, convention, the
engine's availability), lints the draft config under every known convention
(harness.judgement.lint.convention_readings), starts the engine, computes the training-time reference on
the fly (fp32 transformers target through the residual recorder), captures what the engine
feeds the draft, infers from the draft's weights which boundaries it was trained on
(harness.tools.weight_inference), and decides one of three outcomes (harness.tools.doctor_outcome):
wired as trained, miswired (with the fix, re-served to verify it), or cannot tell (with the
candidates and what would separate them).

Without `--prompts` the doctor makes its own evidence: text sampled from the target itself
(its own distribution, from its BOS token, seeded), in rounds of ROUND_PROMPTS until the
outcome is decided or MAX_ROUNDS rounds are spent; the weight test's significance level is
split over those looks. Every engine call runs under the deadlines `run` uses
(harness.run.timeouts), so a hung engine ends the doctor with a `hang` finding, never a hang.
Progress goes to stderr (`progress`), findings to stdout (`say`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NESTED, TOP_LEVEL = "specforge-nested", "speculators-top-level"
IDS = "eagle_aux_hidden_state_layer_ids"
# with --prompts (text of the draft's own training distribution): tokens the target continues
# each prompt by, all scored (24 prompts x 32 tokens name 3 of the 4 bundle drafts' layers)
PROMPT_NEW_TOKENS = 32
# --prompts limits: the inference scores every candidate boundary set on every prompt (about
# 0.2 s per prompt for the 84 candidates of the bundle, one core), so 256 prompts are minutes
# already, while the sampling error shrinks only as 1/sqrt(prompts)
MAX_PROMPTS, MAX_PROMPT_TOKENS, MAX_PROMPTS_BYTES = 256, 2048, 16 * 2 ** 20
# the doctor's own evidence (no --prompts): rounds of sampled text. 24 prompts of 48 tokens
# name the bundle's embed-first draft (the seed case's) in one round; 4 rounds bound the time
ROUND_PROMPTS, MAX_ROUNDS, SAMPLE_LEN, SAMPLE_TEMPERATURE = 24, 4, 48, 1.0
STEPS = 5


class DoctorError(ValueError):
    """Bad input: one line naming the problem and the fix."""


def config_layout(cfg: Any, path: Path) -> tuple[str, list[int]]:
    """(layout, ids) of a draft config: SpecForge/SGLang nest the ids in `eagle_config`,
    speculators puts them at the top level beside `speculators_model_type`."""
    if not isinstance(cfg, dict):
        raise DoctorError(f"{path} is not a JSON object; pass the draft's config.json")
    if isinstance(cfg.get("eagle_config"), dict) and IDS in cfg["eagle_config"]:
        layout, ids = NESTED, cfg["eagle_config"][IDS]
    elif "speculators_model_type" in cfg and IDS in cfg:
        layout, ids = TOP_LEVEL, cfg[IDS]
    else:
        raise DoctorError(f"{path} is neither a SpecForge/SGLang draft config (eagle_config."
                          f"{IDS}) nor a speculators one (speculators_model_type with a top-level "
                          f"{IDS}); export the draft in one of these layouts")
    # bools are ints to Python (True == 1): [true, 3, 4] is a broken export, not ids [1, 3, 4]
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise DoctorError(f"{path}: {IDS} must be a non-empty list of ints, got {json.dumps(ids)}; "
                          f"write the layer ids as integers")
    return layout, list(ids)


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise DoctorError(f"{path} not found; pass the {what} folder (with config.json)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise DoctorError(f"{path} is not readable JSON ({str(e).splitlines()[0]}); re-export the "
                          f"{what}") from None


def with_ids(draft_dir: Path, ids: Sequence[int], layout: str, scratch: Path) -> Path:
    """A copy of the draft folder whose config lists `ids` where `layout` keeps them (same
    weights: a fix is a config change)."""
    out = scratch / ("ids_" + "_".join(str(i).replace("-", "m") for i in ids))
    shutil.copytree(draft_dir, out, dirs_exist_ok=True)
    cfg = json.loads((draft_dir / "config.json").read_text())
    if layout == NESTED:
        cfg["eagle_config"][IDS] = list(ids)
    else:
        cfg[IDS] = list(ids)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def prepare_report_dir(path: Path) -> Path:
    """The report folder, refused before any work if it cannot take a report (a file, a folder
    that cannot be created or written), and emptied of an earlier report first, so a doctor
    refused later leaves no stale verdict behind."""
    from harness.reports.report import clear_reports

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DoctorError(f"--report-dir {path} is a file; pass a folder (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        clear_reports(path)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as e:
        raise DoctorError(f"--report-dir {path} cannot be written ({e.strerror or e}); pass a "
                          f"writable folder") from None
    return path


def read_prompts(path: Path, vocab_size: int, max_len: int | None = None) -> list[list[int]]:
    """`--prompts`: a JSON list of token-id lists (text of the draft's training distribution),
    cut to the shortest one's length so every prompt is scored from the same position."""
    path = Path(path)
    if not path.is_file():
        raise DoctorError(f"--prompts {path} is not a file; pass a JSON file holding a list of "
                          f"token-id lists")
    if path.stat().st_size > MAX_PROMPTS_BYTES:
        raise DoctorError(f"--prompts {path} is {path.stat().st_size} bytes, over the "
                          f"{MAX_PROMPTS_BYTES} limit; pass a sample of at most {MAX_PROMPTS} prompts")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DoctorError(f"--prompts {path}: cannot read it as JSON ({type(e).__name__}); pass a "
                          f"file holding a list of token-id lists") from None
    if (not isinstance(rows, list) or not rows
            or not all(isinstance(r, list) and r and all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in r) for r in rows)):
        raise DoctorError(f"--prompts {path}: expected a non-empty JSON list of non-empty lists of "
                          f"token ids, e.g. [[12, 7, 99], [4, 5, 6]]")
    if len(rows) > MAX_PROMPTS:
        raise DoctorError(f"--prompts {path} holds {len(rows)} prompts, over the limit of "
                          f"{MAX_PROMPTS} (every candidate is scored on every prompt); pass a "
                          f"random sample of {MAX_PROMPTS} or fewer")
    bad = sorted({t for r in rows for t in r if not 0 <= t < vocab_size})
    if bad:
        raise DoctorError(f"--prompts {path}: token ids {bad[:5]} are outside the target's vocabulary "
                          f"(0..{vocab_size - 1}); tokenize with the target's tokenizer")
    length = min(len(r) for r in rows)
    top = min(MAX_PROMPT_TOKENS, max_len if max_len else MAX_PROMPT_TOKENS) - PROMPT_NEW_TOKENS
    if length > top:
        raise DoctorError(f"--prompts {path}: prompts of {length} tokens (the shortest; all are cut "
                          f"to it) leave no room for the {PROMPT_NEW_TOKENS} tokens the target "
                          f"continues them by; pass prompts of at most {top} tokens")
    return [r[:length] for r in rows]


class Progress:
    """Step lines and progress on stderr, with the elapsed time; silent when quiet."""

    def __init__(self, write: Callable[[str], None] | None, started: float) -> None:
        self.write, self.started = write, started

    def __call__(self, text: str) -> None:
        if self.write is not None:
            self.write(f"{text} [{time.time() - self.started:.0f} s]")

    def step(self, i: int, text: str) -> None:
        self(f"[{i}/{STEPS}] {text}")


@dataclass
class Served:
    """One engine call's result: features, or why there are none (a crash, a hang)."""

    features: list[Any] | None = None
    crash: str | None = None
    hang: Any = None  # a timeouts.EngineHang


def _close(engine: Any, budget: Any) -> None:
    from harness.run.timeouts import EngineHang, call_with_deadline

    try:
        call_with_deadline(engine.close, (), budget.deadline(0, False), "close")
    except EngineHang:
        pass  # a close that hangs too: the daemon thread is left behind (timeouts doc)


def start_engine(engine_cls: type, target: Path, draft: Path, options: Any,
                 budget: Any) -> tuple[Any, Served, Any]:
    """The engine under the start-up deadline, and the budget for its calls (its first call's
    allowance derived from the start-up measured, as in `run`). An engine that is not
    installed is bad input (DoctorError, exit 2: the doctor cannot say anything about it),
    never an engine failure; one that crashes or hangs on this draft is a finding."""
    from harness.engines.base import EngineUnavailable
    from harness.run.timeouts import EngineHang, start_measured

    try:
        engine, measured = start_measured(lambda: engine_cls(target, draft, options), budget,
                                          engine_cls)
        return engine, Served(), measured
    except EngineUnavailable as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise DoctorError(f"engine {getattr(engine_cls, 'name', engine_cls.__name__)} is unavailable "
                          f"here: {first}; install it, or use --engine reference") from None
    except EngineHang as e:
        return None, Served(hang=e), budget
    except Exception as e:  # noqa: BLE001 - whatever the engine raises on this draft is its failure
        return None, Served(crash=_failure(e)), budget


def serve(engine_cls: type, target: Path, draft: Path, options: Any, budget: Any,
          prompts: list[list[int]], engine: Any = None) -> Served:
    """What the engine feeds the draft on `prompts`, every call bounded; the engine is closed.
    `engine`: one just started (by `start_engine`, with `budget` its budget), whose capture
    is still its first call: that call carries the start-up allowance either way (vLLM
    starts the engine with the draft on it)."""
    from harness.run.timeouts import EngineHang, call_with_deadline, call_work

    if engine is None:
        engine, failed, budget = start_engine(engine_cls, target, draft, options, budget)
        if engine is None:
            return failed
    try:
        work = call_work("capture", (prompts,))
        capture = call_with_deadline(engine.capture, (prompts,), budget.deadline(work, True),
                                     "capture", work)
        return Served(features=list(capture.features))
    except EngineHang as e:
        return Served(hang=e)
    except Exception as e:  # noqa: BLE001 - an engine that raises on this draft failed on it
        return Served(crash=_failure(e))
    finally:
        _close(engine, budget)


def _failure(e: BaseException) -> str:
    """An engine's error as one line: EngineCrash carries the engine's own text; anything else
    an engine raises on a draft (the reference refuses ids its convention cannot read with a
    LayerIdError) is named by its type too."""
    from harness.engines.base import EngineCrash

    first = (str(e).strip().splitlines() or [""])[0]
    return (first or type(e).__name__) if isinstance(e, EngineCrash) else f"{type(e).__name__}: {first}"


def fed_labels(features: Sequence[Any], golden: Sequence[Any], dtype: str) -> list[Any]:
    """What each engine slot holds (a boundary, or a label of a state no training feeds),
    fingerprinted against the target's states, independent of what training used."""
    from harness.core.tolerances import tolerance_for
    from harness.diagnosis.fingerprint import fingerprint

    tol = tolerance_for(dtype)
    return [s.found for s in fingerprint(features, golden, [], tol.rtol, tol.separation)]


def fix_conventions(engine_convention: Any, convention: str | None) -> list[Any]:
    """The id conventions to word a fix in: the engine's own for this target; for an engine
    that honours the trainer's (the reference: None), the one given, else the two it reads
    (SpecForge's, and "-1 = embedding" where an id is -1)."""
    if engine_convention:
        return [engine_convention]
    return [convention] if convention else ["specforge", "embedding-minus-one"]


def run_doctor(target: Path, draft: Path, engine_name: str, convention: str | None,
               device: str, dtype: str | None, report_dir: Path | None,
               say: Callable[[str], None] = print, prompts_file: Path | None = None,
               progress: Callable[[str], None] | None = None, timeout_scale: float = 1.0) -> int:
    """The doctor; returns the exit code (harness.tools.doctor_outcome.EXIT_CODES; 2 is raised as
    DoctorError). `say`: the findings (stdout); `progress`: steps and progress (stderr; None
    sends them to `say`)."""
    import torch

    started = time.time()
    if report_dir is not None:
        report_dir = prepare_report_dir(Path(report_dir))
    # no progress line before the checks: refused input is one line on stderr, nothing else
    tell = Progress(progress if progress is not None else say, started)
    checked = _checked_inputs(Path(target), Path(draft), engine_name, convention, device,
                              timeout_scale, prompts_file)
    threads = torch.get_num_threads()
    if device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # one intra-op thread, as the suite's runs use (suites/conftest.py): measured on the
        # shared 2-core machine, sampling 24 texts took 98 s with torch's default 2 threads
        # and 3 s with one (oversubscription); OMP_NUM_THREADS overrides it for a big target
        torch.set_num_threads(1)
    try:
        return _Doctor(checked, engine_name, convention, device, dtype, report_dir, say, tell,
                       started).run()
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Inputs:
    target: Path
    draft: Path
    tcfg: dict[str, Any]
    layout: str
    ids: list[int]
    engine_cls: type
    engine_convention: Any  # the engine's rule for this target (a key or a Convention), or None
    budget: Any
    user_prompts: list[list[int]] | None
    prompts_file: Path | None


def _checked_inputs(target: Path, draft: Path, engine_name: str, convention: str | None,
                    device: str, timeout_scale: float, prompts_file: Path | None) -> _Inputs:
    """Every input the doctor takes, checked before any work (DoctorError: one line)."""
    import math

    from harness.core.boundaries import CONVENTIONS
    from harness.core.config_schema import target_config_problems
    from harness.engines.base import EngineUnavailable
    from harness.run.registry import EngineLookupError, resolve_engine
    from harness.run.run_inputs import device_problem
    from harness.run.timeouts import CallBudget

    tcfg = _read_json(target / "config.json", "target")
    problems = target_config_problems(tcfg) if isinstance(tcfg, dict) else [("config.json", "not a JSON object")]
    if problems:
        raise DoctorError(f"target config: {problems[0][0]}: {problems[0][1]}")
    layout, ids = config_layout(_read_json(draft / "config.json", "draft"), draft / "config.json")
    if not (draft / "model.safetensors").is_file():
        raise DoctorError(f"{draft / 'model.safetensors'} not found; pass the draft folder with its "
                          f"weights")
    if convention is not None and convention not in CONVENTIONS:
        raise DoctorError(f"unknown convention {convention!r}; use one of {sorted(CONVENTIONS)}")
    if not (isinstance(timeout_scale, (int, float)) and math.isfinite(timeout_scale) and timeout_scale >= 0):
        raise DoctorError(f"--engine-timeout-scale {timeout_scale} is not a factor; pass a number "
                          f">= 0 (0 turns the deadlines off)")
    problem = device_problem(device)
    if problem:
        raise DoctorError(problem)
    try:
        engine_cls = resolve_engine(engine_name)
    except EngineLookupError as e:
        raise DoctorError(str(e)) from None
    except EngineUnavailable as e:
        raise DoctorError(f"engine {engine_name} is unavailable here: {str(e).splitlines()[0]}; "
                          f"install it, or use --engine reference") from None
    if engine_name == "vllm":
        from harness.engines.vllm import _vllm_distribution

        if _vllm_distribution() is None:  # found before any work, not at the engine's start
            raise DoctorError("engine vllm is unavailable here: vllm is not installed; install it "
                              "with pip install -e '.[vllm]', or use --engine reference")
    try:  # vLLM's rule depends on the target's architecture; one it does not model is refused
        engine_convention = engine_cls.convention_for_target(target)
    except EngineUnavailable as e:
        raise DoctorError(f"engine {engine_name} cannot be judged on this target: "
                          f"{str(e).splitlines()[0]}; or use --engine reference") from None
    from harness.core.boundaries import LayerIdError, ids_to_boundaries
    from harness.judgement.lint import lint_draft

    if convention is not None and engine_convention is None:
        # an engine that honours the trainer's convention (the reference) reads the ids in it:
        # ids it cannot read would only make it fail, a finding about the assumption, not it
        try:
            ids_to_boundaries(ids, convention, int(tcfg["num_hidden_layers"]))
        except LayerIdError as e:
            raise DoctorError(f"--convention {convention} cannot read the config's ids {ids} ({e}); "
                              f"name the trainer's convention or leave --convention out") from None
    problems = lint_draft(draft, tcfg, None)
    if problems:  # a broken draft is not a finding about the engine
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise DoctorError(f"draft lint: {problems[0]}{more}; fix the draft folder")
    user = None
    if prompts_file is not None:
        user = read_prompts(prompts_file, int(tcfg["vocab_size"]),
                            tcfg.get("max_position_embeddings"))
    return _Inputs(target, draft, tcfg, layout, ids, engine_cls, engine_convention,
                   CallBudget(scale=float(timeout_scale)),
                   user, prompts_file)


class _Doctor:
    """One doctor run over checked inputs (the steps of the module doc)."""

    def __init__(self, inputs: _Inputs, engine_name: str, convention: str | None, device: str,
                 dtype: str | None, report_dir: Path | None, say: Callable[[str], None],
                 tell: Progress, started: float) -> None:
        from harness.engines.base import EngineOptions

        self.i, self.engine_name, self.convention, self.device = inputs, engine_name, convention, device
        self.report_dir, self.say, self.tell, self.started = report_dir, say, tell, started
        self.n = int(inputs.tcfg["num_hidden_layers"])
        self.options = EngineOptions(dtype=dtype or inputs.engine_cls.default_dtype, device=device,
                                     training_convention=convention)

    # -- evidence ----------------------------------------------------------------------------

    def _reference(self) -> tuple[Any, list[list[int]], list[Any], int]:
        """The fp32 target, the first prompts, their features, and where scoring starts."""
        import torch

        from harness.golden.features import target_features
        from harness.models.target import load_target
        from harness.tools.weight_inference import greedy_prompts

        try:
            model = load_target(self.i.target, torch.float32, self.device)
        except Exception as e:  # noqa: BLE001 - a target that does not load is bad input
            first = (str(e).strip().splitlines() or [""])[0]
            raise DoctorError(f"cannot load the target {self.i.target} ({type(e).__name__}: "
                              f"{first}); pass an HF-format target folder with its weights") from None
        if self.i.user_prompts is not None:
            seeds = self.i.user_prompts
            self.tell.step(1, f"training-time reference: fp32 target on {self.device}, "
                              f"{len(seeds)} prompts of {self.i.prompts_file} ({len(seeds[0])} tokens "
                              f"each) continued {PROMPT_NEW_TOKENS} tokens by the target")
            prompts, score_from = greedy_prompts(model, seeds, PROMPT_NEW_TOKENS), len(seeds[0])
        else:
            self.tell.step(1, f"training-time reference: fp32 target on {self.device}, "
                              f"{ROUND_PROMPTS} texts of {SAMPLE_LEN} tokens sampled from the target "
                              f"(round 1 of at most {MAX_ROUNDS})")
            prompts, score_from = self._sample(model, 0), 1
        return model, prompts, [target_features(model, p) for p in prompts], score_from

    def _sample(self, model: Any, round_: int) -> list[list[int]]:
        from harness.tools.weight_inference import sampled_prompts

        start = self.i.tcfg.get("bos_token_id")
        start = start if isinstance(start, int) and 0 <= start < int(self.i.tcfg["vocab_size"]) else 0
        return sampled_prompts(model, ROUND_PROMPTS, SAMPLE_LEN, seed=round_, start=start,
                               temperature=SAMPLE_TEMPERATURE)

    def _draft_model(self, model: Any) -> Any:
        import torch
        from safetensors import safe_open

        from harness.models.draft import Eagle3Draft

        dmodel = Eagle3Draft.load(self.i.draft, torch.float32, self.device)
        with safe_open(str(self.i.draft / "model.safetensors"), "pt") as f:
            if "embed_tokens.weight" not in f.keys():  # SpecForge drafts share the target's
                dmodel.embed_tokens.weight.data.copy_(model.model.embed_tokens.weight.data)
        return dmodel

    def _weights(self, model: Any, prompts: list[list[int]], feats: list[Any], score_from: int,
                 fed: list[Any] | None) -> tuple[Any, Any, Any]:
        """Weight inference in rounds until the outcome is decided or the budget is spent:
        (inference, outcome, block scores)."""
        from harness.golden.features import target_features
        from harness.tools.doctor_outcome import CANNOT_TELL, decide, scorable
        from harness.tools.weight_inference import BlockScores, compare, infer_boundaries

        dmodel = self._draft_model(model)
        scores = BlockScores(dmodel, score_from)
        scores.add(prompts, feats)
        looks = 1 if self.i.user_prompts is not None else MAX_ROUNDS
        def more(prompts: int) -> str:
            """What would separate the candidates, for a "cannot tell" on `prompts` prompts."""
            text = (f"a larger sample of the draft's training text (--prompts FILE, up to "
                    f"{MAX_PROMPTS} prompts)" if self.i.user_prompts is not None else
                    f"a sample of the draft's training text (--prompts FILE): the doctor's own "
                    f"{prompts} texts sampled from the target left them within the sampling error")
            return text + ("; the trainer's convention would settle it only if the config's ids "
                           "were surely the ones training used (--convention is printed as an "
                           "assumption, never taken as the verdict)")

        for round_ in range(1, looks + 1):
            begun = time.time()
            inference = infer_boundaries(dmodel, [], [], scores=scores, looks=looks, progress=self.tell)
            versus = None
            if fed is not None and scorable(fed, len(inference.boundaries), self.n) \
                    and list(fed) != inference.boundaries:
                versus = compare(scores, inference, fed)
            outcome = decide(inference, fed if fed is not None else list(inference.boundaries),
                             self.n, versus, more(inference.prompts))
            decided = (outcome.kind != CANNOT_TELL if fed is not None else not inference.ambiguous)
            # a draft that predicts the text worse than the constant guess beyond the sampling
            # error (an untrained draft, or one of another target) will not be rescued by more
            # of the same text: stop rather than spend the budget
            hopeless = inference.accuracy - inference.baseline_accuracy < -inference.baseline_threshold
            spent = time.time() - begun
            ahead = ("" if decided or round_ == looks else
                     "; the draft predicts this text worse than always guessing one token, so "
                     "more of it cannot help: stopping" if hopeless else
                     f"; not decided: up to {looks - round_} more round(s) of {ROUND_PROMPTS} "
                     f"texts, about {spent:.0f} s each")
            self.tell(f"  round {round_}/{looks}: {inference.prompts} prompts scored, best "
                      f"{inference.boundaries}, margin {inference.margin:+.3f} vs threshold "
                      f"{inference.threshold:.3f}: {outcome.kind} ({spent:.0f} s this round{ahead})")
            if decided or hopeless or round_ == looks:
                return inference, outcome, scores
            extra = self._sample(model, round_)
            scores.add(extra, [target_features(model, p) for p in extra])
        raise AssertionError("unreachable: the last round returns")

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> int:
        from harness.core.boundaries import LayerIdError, ids_to_boundaries, short_boundary
        from harness.judgement.lint import convention_readings
        from harness.tools.doctor_outcome import CANNOT_TELL

        i = self.i
        self.say(f"target {i.target}: {self.n} layers, hidden {i.tcfg['hidden_size']}; draft "
                 f"{i.draft}: {i.layout} layout, ids {i.ids}")
        for line in convention_readings(i.ids, self.n):
            self.say(f"lint: {line}")
        told = None
        if self.convention is not None:
            try:
                told = list(ids_to_boundaries(i.ids, self.convention, self.n))
                self.say(f"ASSUMPTION (--convention {self.convention}, yours, not checked until the "
                         f"weights are read): training fed boundaries {told}")
            except LayerIdError as e:
                self.say(f"ASSUMPTION (--convention {self.convention}): the config's ids {i.ids} "
                         f"mean nothing under it: {e}")

        # the reference first: a target that does not load is bad input, refused before an
        # engine (with its worker processes) is started
        model, prompts, feats, score_from = self._reference()
        self.tell.step(2, f"starting {self.engine_name} ({self.options.dtype}, {self.device})")
        engine, failed, budget = start_engine(i.engine_cls, i.target, i.draft, self.options,
                                              i.budget)
        self._prompts, self._feats = prompts, feats  # the fix is re-served on the same prompts
        self.tell.step(3, f"capturing what {self.engine_name} feeds the draft on {len(prompts)} prompts")
        served = failed if engine is None else serve(i.engine_cls, i.target, i.draft, self.options,
                                                     budget, prompts, engine)
        if served.features is None:  # the engine's failure is the finding; the weights wait
            return self._failed(served)
        try:
            fed = fed_labels(served.features, feats, self.options.dtype)
        except ValueError as e:  # rows or widths that are no capture of these prompts at all
            return self._failed(Served(crash=f"the engine's features are no capture of the "
                                             f"prompts: {str(e).splitlines()[0]}"))
        self.tell.step(4, "inferring the trained boundaries from the draft's weights")
        inference, outcome, scores = self._weights(model, prompts, feats, score_from, fed)
        self.say(inference.line())
        diag, outcome = self._diagnosis(served, outcome, model, prompts, feats)
        self._assumption(told, outcome, inference, scores)
        if outcome.trained is not None:
            shared = outcome.shared_slots()
            named = (f"boundaries {outcome.trained} ("
                     f"{', '.join(short_boundary(b, self.n) for b in outcome.trained)})")
            if len(outcome.plausible) > 1:
                named += (f"; the weights do not separate it from "
                          f"{_cands(outcome.plausible[1:])}, and agree on slot(s) {shared}")
            self.say(f"{'trained on' if outcome.kind != CANNOT_TELL else 'best candidate, not decided'}: "
                     f"{named} — inferred from the weights")
        self.say(f"fed: {fed}")
        if diag is not None:
            self.say(f"diagnosis: {diag.kind}: {diag.message}")
        fix = self._fix(outcome, diag) if outcome.kind == "miswired" else None
        return self._report(outcome, inference, diag, fed, fix, prompts)

    def _diagnosis(self, served: Served, outcome: Any, model: Any, prompts: list[list[int]],
                   feats: list[Any]) -> tuple[Any, Any]:
        """The capture diagnosis against the weights' best candidate (the same judgement as the
        suite's capture check), for every outcome but "cannot tell"."""
        from dataclasses import replace

        from harness.tools.doctor_outcome import CANNOT_TELL, MISWIRED, WIRED

        if outcome.kind == CANNOT_TELL:
            return None, outcome
        diag = self._judge(served.features, outcome.trained, self.i.ids, "doctor::capture", model,
                           prompts, feats)
        if outcome.kind == WIRED and diag.kind != "ok":
            outcome = replace(outcome, kind=MISWIRED,
                              evidence=f"the slots are the trained boundaries, but the capture "
                                       f"check fails them: {diag.kind}")
        return diag, outcome

    def _failed(self, served: Served) -> int:
        """The engine crashed or hung on the draft: that is the finding (exit 1), reported
        without reading the weights, which could not change it."""
        from harness.diagnosis.crash import crash_diagnosis
        from harness.run.timeouts import hang_diagnosis
        from harness.tools.doctor_outcome import ENGINE_FAILED, Outcome

        if served.hang is not None:
            diag = hang_diagnosis(self.engine_name, served.hang)
        else:
            diag = crash_diagnosis(served.crash or "", self.i.ids, int(self.i.tcfg["hidden_size"]),
                                   engine_convention=self._engine_conv(), num_layers=self.n)
        self.say(f"fed: {_no_features(served)}")
        self.say(f"diagnosis: {diag.kind}: {diag.message}")
        outcome = Outcome(ENGINE_FAILED, None, [], None, diag.message.split("; root cause")[0])
        return self._report(outcome, None, diag, None, None, self._prompts)

    def _judge(self, captured: Sequence[Any], trained: Sequence[int], config_ids: Sequence[int],
               check: str, model: Any, prompts: list[list[int]], feats: list[Any]) -> Any:
        """The suite's own judgement of a capture: fp32 strict; reduced precision against the
        precision envelope of the target itself in the engine's dtype (harness/golden/envelope.py;
        a fixed rtol cries wolf there, and a verified fix would read as "fix fails")."""
        from harness.golden.envelope import EnvelopeBuilder
        from harness.judgement.assertions import CaptureContext, judge_capture
        from harness.judgement.precision import is_reduced

        envelopes = None
        if is_reduced(self.options.dtype):
            if not hasattr(self, "_envelopes"):
                builder = EnvelopeBuilder(self.i.target, model)
                self._envelopes = [builder.envelope(p, self.options.dtype) for p in prompts]
            envelopes = self._envelopes
        ctx = CaptureContext(training_boundaries=trained, config_ids=config_ids,
                             dtype=self.options.dtype, engine_name=self.engine_name,
                             draft=self.i.draft.name, check=check, engine_convention=self._engine_conv())
        # a failed judgement's diagnosis as raised (an `ok` on a failure reads `unrecognised`)
        return judge_capture(ctx, features=captured, golden=feats, prompts=prompts,
                             envelopes=envelopes).diagnoses[0]

    def _engine_conv(self) -> str | None:
        return self.i.engine_convention or self.convention

    def _assumption(self, told: list[int] | None, outcome: Any, inference: Any, scores: Any) -> None:
        """The user's convention, weighed against the weights and never in their place."""
        from harness.tools.doctor_outcome import CANNOT_TELL
        from harness.tools.weight_inference import compare

        if told is None:
            return
        if outcome.trained is not None and told == outcome.trained and outcome.kind != CANNOT_TELL:
            self.say(f"ASSUMPTION agrees with the weights: training fed {told}")
            return
        if inference.informative and len(told) == len(inference.boundaries) and told != inference.boundaries:
            margin, threshold = compare(scores, inference, told)
            if margin > threshold and margin > 0:
                self.say(f"ASSUMPTION CONTRADICTED by the weights: the config's ids read as "
                         f"{self.convention} mean {told}, but fed {told} the draft predicts worse "
                         f"than fed {inference.boundaries} by {margin:+.3f} (threshold "
                         f"{threshold:.3f}): the config was written wrong, or the convention is not "
                         f"the trainer's")
                return
        if outcome.kind == CANNOT_TELL:
            fed = outcome.fed
            self.say(f"ASSUMPTION not confirmed: if it holds, the engine feeds "
                     f"{'exactly what training used' if fed == told else f'{fed}, not {told}'}; "
                     f"the weights cannot confirm the assumption, so the outcome stays "
                     f"\"cannot tell\"")

    def _fix(self, outcome: Any, diag: Any) -> dict[str, Any] | None:
        """The id list that makes the engine feed the weights' best candidate, re-served."""
        from harness.core.boundaries import LayerIdError, boundaries_to_ids
        from harness.diagnosis.observed_convention import fix_result

        trained = list(outcome.trained)
        fix_ids = list(diag.suggested_layer_ids) if diag is not None and diag.suggested_layer_ids else None
        why = []
        if fix_ids is None:
            for conv in fix_conventions(self.i.engine_convention, self.convention):
                try:
                    fix_ids = list(boundaries_to_ids(trained, conv, self.n))
                    break
                except LayerIdError as e:
                    why.append(str(e))
        if fix_ids is None:
            self.say(f"fix: no id list makes {self.engine_name} feed {trained}: {'; '.join(why)}")
            return None
        if fix_ids == list(self.i.ids):
            fix_ids = _observed_fix(self.i.ids, outcome.fed, trained) or fix_ids
        if fix_ids == list(self.i.ids):
            # the config already names the trained boundaries in this engine's reading: what the
            # engine feeds instead is its own doing, and no config change can fix it
            text = (f"none in the config: its ids {fix_ids} already name {trained} for "
                    f"{self.engine_name}; the engine feeds {outcome.fed} regardless (an engine bug: "
                    f"the diagnosis above)")
            self.say(f"fix: {text}")
            return {"ids": None, "layout": self.i.layout, "suggested": False, "verified": False,
                    "slots": None, "result": text, "diagnosis_kind": diag.kind if diag else None}
        self.tell.step(5, f"re-serving with {IDS} = {fix_ids} ({self.i.layout}) to verify the fix")
        with tempfile.TemporaryDirectory(prefix="eagle3-doctor-") as scratch:
            fixed = with_ids(self.i.draft, fix_ids, self.i.layout, Path(scratch))
            again = serve(self.i.engine_cls, self.i.target, fixed, self.options, self.i.budget,
                          self._prompts)
        slots = None if again.features is None else fed_labels(again.features, self._feats,
                                                                self.options.dtype)
        crash = again.crash or (str(again.hang) if again.hang is not None else None)
        text, holds = fix_result(fix_ids, self.i.layout, trained, True, slots, crash)
        if len(outcome.plausible) > 1:
            text += (f" (for the best candidate {trained}; the weights do not separate it from "
                     f"{_cands(outcome.plausible[1:])})")
        self.say(f"fix: {text}")
        return {"ids": fix_ids, "layout": self.i.layout, "suggested": True, "verified": holds,
                "slots": slots, "result": text, "diagnosis_kind": diag.kind if diag else None}

    def _report(self, outcome: Any, inference: Any, diag: Any, fed: list[Any] | None,
                fix: dict[str, Any] | None, prompts: list[list[int]]) -> int:
        from harness.diagnosis.observed_convention import Observation
        from harness.reports.report import ReportCollector, verdict_line, write_reports
        from harness.tools.doctor_outcome import CANNOT_TELL, WIRED

        collector = ReportCollector()
        check = collector.check("doctor::capture", "doctor::capture", self.i.draft.name, True)
        if diag is not None:
            check.add_diagnosis(diag)
        status = {WIRED: "passed", CANNOT_TELL: "skipped"}.get(outcome.kind, "failed")
        check.settle(status, "" if status == "passed" else f"{outcome.kind}: {outcome.evidence}")
        if fed is not None:
            collector.observe(Observation(self.i.layout, tuple(self.i.ids), self.n, slots=tuple(fed)))
        if fix is not None and fix["ids"] is not None:
            collector.fix(self.i.draft.name, {k: fix[k] for k in ("ids", "layout", "suggested",
                                                                  "diagnosis_kind", "result")})
        trained = outcome.trained if outcome.kind != CANNOT_TELL else None
        report = collector.build(
            engine={"name": self.engine_name, "convention": self._engine_conv()},
            bundle={"name": None, "path": None}, drafts=[self.i.draft.name],
            dtype=self.options.dtype, started=self.started, finished=time.time(),
            extra={"doctor": {"target": str(self.i.target), "draft": str(self.i.draft),
                              "layout": self.i.layout, "config_ids": self.i.ids,
                              "convention_assumed": self.convention,
                              "outcome": outcome.to_json(),
                              "trained_boundaries": trained,
                              "trained_source": "inferred from the weights" if trained else None,
                              "fed_boundaries": fed,
                              "inference": None if inference is None else inference.to_json(),
                              "prompts": len(prompts) if inference is None else inference.prompts,
                              "fix": fix, "fix_verified": bool(fix and fix["verified"])}})
        if outcome.kind == CANNOT_TELL:
            report["summary"]["verdict"] = "cannot tell"
            report["summary"]["verdict_reason"] = outcome.evidence
        self.say(f"doctor: {_headline(outcome, fix)}")
        self.say(f"evidence: {outcome.evidence}")
        if outcome.separate:
            self.say(f"what would separate them: {outcome.separate}")
        if self.report_dir is not None:
            write_reports(report, self.report_dir)
            self.say(f"report: {self.report_dir / 'report.html'}")
        self.say(verdict_line(report))
        return outcome.exit_code


def _observed_fix(ids: Sequence[int], fed: Sequence[Any] | None, trained: Sequence[int]) -> list[int] | None:
    """Ids from the engine's observed reading, where it is a plain offset (b = id + d, slots
    in any order: engines sort): the trained boundaries minus d. Only a candidate: the doctor
    re-serves it, and the re-served capture decides."""
    if not fed or len(fed) != len(ids) or not all(isinstance(b, int) and not isinstance(b, bool) for b in fed):
        return None
    offsets = {b - i for b, i in zip(sorted(fed), sorted(ids), strict=True)}
    if len(offsets) != 1:
        return None
    d = offsets.pop()
    out = [b - d for b in trained]
    return out if all(i >= 0 for i in out) and out != list(ids) else None


def _headline(outcome: Any, fix: dict[str, Any] | None) -> str:
    """The outcome in the words of issue #32: "miswired: trained at X, served at Y, fix Z"."""
    from harness.tools.doctor_outcome import CANNOT_TELL, MISWIRED, WIRED

    if outcome.kind == WIRED:
        return f"WIRED AS TRAINED: the engine feeds {outcome.fed}, the boundaries training used"
    if outcome.kind == CANNOT_TELL:
        if outcome.trained is None:
            return "CANNOT TELL: on this text the draft's weights say nothing about its training"
        return (f"CANNOT TELL: the engine feeds {outcome.fed}; the weights do not separate "
                f"{_cands(outcome.plausible)} (they agree on slot(s) {outcome.shared_slots()})")
    if outcome.kind != MISWIRED:
        return f"{outcome.kind.upper()}"
    trained = str(outcome.trained)
    if len(outcome.plausible) > 1:
        trained += (f" (or {_cands(outcome.plausible[1:])}: the weights agree on slot(s) "
                    f"{outcome.shared_slots()})")
    if fix is None:
        fixed = "no id list makes this engine feed it (see fix: above)"
    elif fix["ids"] is None:
        fixed = "none in the config, the engine feeds it wrong (see diagnosis: above)"
    else:
        fixed = f"ids {fix['ids']} ({'verified by re-serving' if fix['verified'] else 'NOT verified: see fix: above'})"
    return f"MISWIRED: trained at {trained}, served at {outcome.fed}, fix: {fixed}"


def _cands(cands: Sequence[Sequence[int]]) -> str:
    from harness.tools.doctor_outcome import candidates_text

    return candidates_text(cands)


def _no_features(served: Served) -> str:
    if served.hang is not None:
        return f"nothing (the engine hung: {served.hang})"
    return f"nothing (the engine crashed: {served.crash})"
