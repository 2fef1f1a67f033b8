"""Building and loading the fused CPU kernel of bucketed MATE (``impl=kernel``), ``csrc/mate_bucketed_cpu.cpp``.

Built on first use with ``torch.utils.cpp_extension`` (a C++ compiler; tens of seconds, once), cached in
:func:`build_dir` and loaded as ``torch.ops.mate_cpu``: the long-row forward, the dense-row forward, one backward and
:func:`vector_lanes` (schemas at the end of the C++ source, whose header says how it works). ``make install`` builds
it ahead of time (:func:`main`); ``MATE_CPU_KERNEL=0`` turns it off. :mod:`.bucketed` calls it.

The library is loaded only from a folder that no one but its owner (this user, or root) can write, the build folder
and the one holding it, and only when its bytes are those recorded at its build (``mate_bucketed_cpu.so.sha256``,
written by this module after torch builds it). A library that differs, or that has no record (built by an older
mate_cli), is built again (one warning); a folder of another user's is refused (one warning, the torch path), one
of this user's that others can write is made private and built again.

Where it cannot be built or loaded, :func:`available` is False, one warning says why, and the torch path runs: the
same function, about half as fast (BENCHMARKS.md, "CPU kernels").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import shlex
import shutil
import sys
import threading
from pathlib import Path

import torch

from mate_cli.io import file_sha256, writable
from mate_cli.paths import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "mate_bucketed_cpu.cpp"
#: -march=native: the build is keyed by this CPU (:func:`_cpu_tag`). The math flags let max/sum reductions
#: vectorise (the kernel's values are finite by construction); compile-only, so no fast-math start-up code changes
#: the process's FP mode.
FLAGS = [
    "-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
    "-ffinite-math-only", "-fno-signed-zeros", "-fassociative-math", "-freciprocal-math",
]  # fmt: skip
#: Extra compiler flags, after FLAGS and in the build's key: the tests build the narrower vector paths with
#: ``MATE_CPU_KERNEL_CFLAGS=-mno-avx512f`` (AVX2) or ``-mno-avx`` (SSE).
EXTRA_FLAGS_ENV = "MATE_CPU_KERNEL_CFLAGS"


def build_flags() -> list[str]:
    value = os.environ.get(EXTRA_FLAGS_ENV, "")
    try:
        return FLAGS + shlex.split(value)
    except ValueError as err:  # load() turns this into its one warning line
        raise ValueError(
            f"{EXTRA_FLAGS_ENV}={value!r} is not a list of compiler flags ({err}); fix or unset it"
        ) from None


#: Whether the library loaded ("ok") and why not ("why"): process-wide, as a shared library is loaded once per
#: process and cannot be unloaded.
_lock = threading.Lock()
_state: dict = {}


def _cpu_tag() -> str:
    """Torch/Python versions, CPU model/flags, compiler flags and source: a build for this machine (-march=native)."""
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags", "Features")):
                cpu += line
    except OSError:
        pass
    text = f"{torch.__version__}|{sys.version_info[:2]}|{cpu}|{build_flags()}|".encode() + SOURCE.read_bytes()
    return hashlib.sha256(text).hexdigest()[:12]


class UntrustedBuild(Exception):
    """The kernel's folder or library is not one this process may load code from; the message says why and the fix."""


#: the record of a build: the library's sha256, beside it
DIGEST_SUFFIX = ".sha256"


def _library_digest(library: Path) -> str:
    return file_sha256(library)


def record_build(library: Path) -> None:
    """Write the sha256 of the library just built beside it (replaced in one rename)."""
    record = library.with_name(library.name + DIGEST_SUFFIX)
    tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
    tmp.write_text(_library_digest(library) + "\n", encoding="utf-8")
    os.replace(tmp, record)


def unrecorded(library: Path) -> str | None:
    """Why ``library`` is not the one built here (no record, or other bytes than recorded), or None."""
    record = library.with_name(library.name + DIGEST_SUFFIX)
    try:
        recorded = record.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return f"no {record.name} records its build (built by an older mate_cli)"
    except (OSError, UnicodeDecodeError) as err:
        return f"its record {record.name} is unreadable ({type(err).__name__})"
    if _library_digest(library) != recorded:
        return f"{library.name} is not the library built there (its sha256 differs from {record.name})"
    return None


def check_private(directory: Path) -> None:
    """Refuse (:class:`UntrustedBuild`) ``directory`` or its parent when another user owns it or its group or others
    may write it: whoever can write there can put code into every MATE run that loads the kernel."""
    me = os.geteuid()
    for folder in (directory, directory.parent):
        info = folder.stat()
        if info.st_uid not in (me, 0):
            why = f"is owned by another user (uid {info.st_uid})"
        elif info.st_mode & 0o022:
            why = "can be written by its group or others"
        else:
            continue
        raise UntrustedBuild(
            f"{folder} {why}, and a library loaded from there runs in this process; use a folder only you can write "
            f"(chmod go-w {folder}, or set TORCH_EXTENSIONS_DIR or MATE_CACHE_DIR to one)"
        )


def make_private(directory: Path) -> bool:
    """Make ``directory`` and its parent writable by this user alone: made so where missing, and where this user owns
    one its group or others could write (a umask of 002) its ``go-w`` taken. True when it took one: what is there may
    not be this build's, so it is built again. A folder of another user's is left to :func:`check_private`."""
    tightened = False
    for folder in (directory.parent, directory):
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(folder.stat().st_mode & ~0o022)
            continue
        info = folder.stat()
        if info.st_uid == os.geteuid() and info.st_mode & 0o022:
            folder.chmod(info.st_mode & ~0o022)
            log.warning(
                "MATE CPU kernel: %s could be written by its group or others; made private (chmod go-w)", folder
            )
            tightened = True
    return tightened


def clear_build(directory: Path) -> None:
    """Remove what an earlier build left in ``directory`` (objects, ninja file, library, record) but the flock."""
    for path in directory.iterdir():
        if path.name != ".mate-build.flock":
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def build_dir() -> Path:
    """``$TORCH_EXTENSIONS_DIR`` (one build shared by jobs with their own data caches) or
    ``<MATE_CACHE_DIR>/torch_extensions``, then a folder named by torch version, CPU, flags and source."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    return (Path(root) if root else cache_dir() / "torch_extensions") / f"mate_bucketed_cpu_{_cpu_tag()}"


@contextlib.contextmanager
def build_lock(directory: Path):
    """Hold an ``flock`` on the build directory while torch builds or loads there. Torch's ``lock`` file makes it wait
    forever, silently, after a killed build; the ``flock`` dies with its holder, so while it is held a ``lock`` file is
    stale and removed (one warning). Waiting for a live builder is said once."""
    with open(directory / ".mate-build.flock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another process that is building the MATE CPU kernel in %s", directory)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = directory / "lock"
            if stale.exists():
                log.warning("removing a stale build lock %s (left by a killed build); rebuilding", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load(verbose: bool = False) -> bool:
    """Build (if needed) and load the kernel; True when ``torch.ops.mate_cpu`` is usable."""
    with _lock:
        if "ok" in _state:
            return _state["ok"]
        _state["ok"] = False
        if os.environ.get("MATE_CPU_KERNEL", "1").strip().lower() in ("0", "false", "off", "no"):
            _state["why"] = "MATE_CPU_KERNEL=0"
            return False
        try:
            from torch.utils import cpp_extension

            directory = build_dir()
            built = directory / "mate_bucketed_cpu.so"
            if built.is_file() and not writable(directory):  # a read-only cache: load, never build
                check_private(directory)
                why = unrecorded(built)
                if why is not None:
                    raise UntrustedBuild(f"{directory}: {why}; it cannot be built again in this read-only folder")
                torch.ops.load_library(str(built))
            else:
                tightened = make_private(directory)
                check_private(directory)
                with build_lock(directory):
                    why = unrecorded(built) if built.is_file() else "absent"
                    if why is None and tightened:
                        why = "others could write its folder until now"
                    if why is None:
                        torch.ops.load_library(str(built))
                    else:
                        if why != "absent":
                            (log.info if why.startswith("no ") else log.warning)(
                                "MATE CPU kernel in %s: %s; building it again", directory, why
                            )
                        clear_build(directory)  # a build from scratch: nothing an earlier one left is linked in
                        library = cpp_extension.load(
                            name="mate_bucketed_cpu",
                            sources=[str(SOURCE)],
                            extra_cflags=build_flags(),
                            extra_ldflags=["-fopenmp"],  # resolves to the libgomp torch already loaded (same soname)
                            build_directory=str(directory),
                            is_python_module=False,
                            verbose=verbose,
                        )
                        record_build(Path(library))
            _register_flops()
        except Exception as err:  # no compiler, link error, an untrusted folder, ...: the torch path still works
            lines = str(err).strip().splitlines() or [type(err).__name__]
            _state["why"] = why = next((line.strip() for line in lines if "error:" in line), lines[-1])
            log.warning("MATE fused CPU kernel unavailable (%s); using the pure-torch bucketed path", why[:500])
            return False
        _state["ok"] = True
        return True


def _register_flops() -> None:
    """Tell ``FlopCounterMode`` what the kernels compute. Long rows, per bucket ``f`` (``R`` rows against ``keys[f]``
    global and ``3R`` window keys, scores and context): ``4 R D (keys[f] + 3R)``; dense rows, per head of example b:
    ``4 dense[b] real[b] D``; the backward's five products (scores recomputed, dP, dV, dQ, dK):
    ``10 R D (keys[f] + 3R)`` and ``10 dense[b] real[b] D``. These are the algorithm's FLOPs, not the kernel's (it
    multiplies a chunk of buckets against the most global keys any of them reads, and skips chunks with no row), so a
    rate is useful work per second.
    """
    from torch.utils.flop_counter import register_flop_formula

    @register_flop_formula(torch.ops.mate_cpu.bucketed_forward, get_raw=True)
    def _long(q, k, v, src, dst, allowed, keys, free, dense, head_view, out, radius, scale, *args, out_val=None,
              **kwargs):  # fmt: skip
        return 4 * radius * q.shape[-1] * (int(keys.sum()) + 3 * radius * keys.numel())

    @register_flop_formula(torch.ops.mate_cpu.bucketed_backward, get_raw=True)
    def _backward(q, k, v, grad_out, grad_src, out, src, dst, allowed, keys, free, dense, head_view, real, token_rows,
                  groups, dq, dk, dv, radius, scale, *args, out_val=None, **kwargs):  # fmt: skip
        D, heads = q.shape[-1], head_view.numel()
        long_part = 10 * radius * D * (int(keys.sum()) + 3 * radius * keys.numel())
        return long_part + 10 * D * heads * int((dense.long() * real.long().clamp(min=1)).sum())

    @register_flop_formula(torch.ops.mate_cpu.dense_forward, get_raw=True)
    def _dense(q, k, v, src, dst, dense, real, token_rows, head_view, groups, token_groups, out, scale, *args,
               out_val=None, **kwargs):  # fmt: skip
        return 4 * q.shape[-1] * head_view.numel() * int((dense.long() * real.long().clamp(min=1)).sum())


def available() -> bool:
    """The kernel is loaded (building it on the first call)."""
    return _state["ok"] if "ok" in _state else load()


def unavailable_reason() -> str | None:
    return _state.get("why")


def vector_lanes() -> int:
    """float32 lanes of the loaded build's vector code: 16 (AVX-512), 8 (AVX2), 4 (SSE, NEON)."""
    return int(torch.ops.mate_cpu.vector_lanes())


def main() -> None:
    """``make install``: build ahead of time and say what happened (never fails)."""
    ok = load(verbose="-v" in sys.argv)
    state = f"ready, {vector_lanes()}-lane vectors [{build_dir()}]" if ok else f"unavailable ({unavailable_reason()})"
    print(f"MATE fused CPU kernel: {state}")
