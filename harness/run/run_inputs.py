"""Input values checked before anything runs: one line naming the argument, the problem and
the fix. `run`'s options (shared by the CLI and the pytest plugin so both refuse the same
inputs) and the path arguments of every command (readable inputs, writable outputs).

Only what argparse cannot check lives here (argparse already checks types and choices).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

# A verify step feeds the target k + 1 tokens and the suite generates at most 32 new tokens
# per prompt (the bundle's continuation length), so a chain longer than that is never
# exercised; the bundle's drafts were trained with 7 TTT steps. 32 is a generous ceiling
# that still refuses typos such as 1000.
MAX_DRAFT_TOKENS = 32


def device_problem(device: str) -> str | None:
    """Why torch cannot place a model on `device` here, or None."""
    if device == "cpu":
        return None
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        return f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return (f"--device {device}: this torch build ({torch.__version__}) sees no CUDA "
                    f"device; use --device cpu or install a CUDA build of torch")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            return f"--device {device}: only {count} CUDA device(s) here; use cuda:0..cuda:{count - 1}"
        return None
    if dev.type != "cpu":
        return f"--device {device}: the suite runs on cpu or cuda; use one of those"
    return None


def draft_tokens_problem(k: int) -> str | None:
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        return (f"--num-draft-tokens {k} is out of range; use 1..{MAX_DRAFT_TOKENS} (the suite "
                f"generates at most {MAX_DRAFT_TOKENS} tokens per prompt)")
    return None


def timeout_scale_problem(scale: float) -> str | None:
    if not scale >= 0 or scale == float("inf"):
        return (f"--engine-timeout-scale {scale} is not a factor; use a number >= 0 (0 turns the "
                f"engine-call deadlines off)")
    return None


def run_option_problem(device: str, num_draft_tokens: int, timeout_scale: float) -> str | None:
    """The first problem with these option values, or None."""
    return (draft_tokens_problem(num_draft_tokens) or timeout_scale_problem(timeout_scale)
            or device_problem(device))


# -- paths, shared by every command ----------------------------------------------------------
# A path argument is checked before any work: empty, a symlink loop (`Path.resolve` raises
# RuntimeError on one, `is_dir` merely says False), missing, the wrong kind, unreadable or
# unwritable. Each problem is one line naming the argument, what is wrong and the fix.


def _stat_problem(arg: str, path: Path) -> str | None:
    """Why `path` cannot even be looked at (a loop, a name too long, a non-folder parent)."""
    try:
        path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            return f"{arg} {path} is a symlink to nothing; point it at an existing path"
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{arg} {path} is a symlink loop; point it at a real path"
        if e.errno == errno.ENOTDIR:
            return f"{arg} {path}: a part of it is a file, not a folder; pass a path under a folder"
        return f"{arg} {path} cannot be read ({e.strerror or e}); pass another path"
    return None


def _looked_up(arg: str, given: str | Path, empty_fix: str) -> tuple[Path, str | None]:
    """The path as given and the first reason it cannot be used at all: empty (never read as
    "." — `Path('')` is the current folder), a loop, a name that cannot be looked up."""
    if str(given).strip() == "":
        return Path(), f"{arg} is empty; {empty_fix}"
    path = Path(given)
    return path, _stat_problem(arg, path)


def input_path_problem(arg: str, given: str | Path | None, kind: str) -> str | None:
    """Why `given` is not a readable existing `kind` ("file" or "folder"), or None."""
    if given is None:
        return None
    path, problem = _looked_up(arg, given, f"pass the path of a {kind} (or leave {arg} out for "
                                           f"the default)")
    if problem:
        return problem
    if not path.exists():
        return f"{arg} {path} does not exist; pass an existing {kind}"
    is_kind = path.is_dir() if kind == "folder" else path.is_file()
    if not is_kind:
        return f"{arg} {path} is not a {kind}; pass a {kind}"
    if not os.access(path, os.R_OK | (os.X_OK if kind == "folder" else 0)):
        return f"{arg} {path} is not readable; fix its permissions or pass another {kind}"
    return None


def _writable_folder_problem(arg: str, folder: Path) -> str | None:
    """Try it: os.access says yes to root on a read-only mount, a probe file does not lie."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".eagle3-probe.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return (f"{arg}: cannot write in {folder} ({e.strerror or e}); pass a path in a "
                f"writable folder")
    return None


def _existing_ancestor(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return Path(".")


def _creatable_under(arg: str, path: Path, folder: Path) -> str | None:
    """`folder` and its parents can be looked up and its nearest existing ancestor is a folder
    this process can write in (the missing ones are created when `path` is written)."""
    for p in (folder, *folder.parents):
        problem = _stat_problem(arg, p)
        if problem:
            return problem
    base = _existing_ancestor(folder)
    if not base.is_dir():
        return f"{arg} {path}: {base} is a file, not a folder; pass a path under a folder"
    return _writable_folder_problem(arg, base)


def output_dir_problem(arg: str, given: str | Path) -> str | None:
    """Why the folder `given` cannot be created or written into, or None. Creates nothing."""
    path, problem = _looked_up(arg, given, "pass a folder to write into")
    if problem:
        return problem
    if path.exists() and not path.is_dir():
        return f"{arg} {path} is a file, not a folder; pass a folder (it is created if missing)"
    return _creatable_under(arg, path, path)


def output_file_problem(arg: str, given: str | Path) -> str | None:
    """Why the file `given` cannot be (re)written in place, or None. Creates nothing."""
    path, problem = _looked_up(arg, given, "pass a file to write")
    if problem:
        return problem
    if path.is_dir():
        return f"{arg} {path} is a folder; pass a file path (e.g. {path / 'CONFORMANCE.md'})"
    if path.exists() and not path.is_file():
        return f"{arg} {path} is not a regular file; pass a file path"
    return _creatable_under(arg, path, path.parent)


def text_file_problem(arg: str, given: str | Path, max_bytes: int) -> str | None:
    """Why `given` is not a readable UTF-8 text file of at most `max_bytes`, or None."""
    problem = input_path_problem(arg, given, "file")
    if problem:
        return problem
    path = Path(given)
    size = path.stat().st_size
    if size > max_bytes:
        return (f"{arg} {path} is {size} bytes, more than the {max_bytes} such a file needs; "
                f"pass the right file")
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        return (f"{arg} {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                f"{e.start}); save it as UTF-8")
    except OSError as e:
        return f"{arg} {path} cannot be read ({e.strerror or e}); pass another file"
    return None
