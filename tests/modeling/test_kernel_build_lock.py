"""A kernel build killed half-way must not make later runs hang: torch's stale ``lock``
file is detected and removed; and a library put in the build folder by anyone but this
build is never loaded (real subprocesses, real compiler cache, a real planted library)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from mate_cli.modeling.attention.mate import cpu_kernel as mate_cpu_kernel

LOAD = textwrap.dedent(
    """
    import logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from mate_cli.modeling.attention.mate import cpu_kernel as mate_cpu_kernel
    print("loaded" if mate_cpu_kernel.load() else "unavailable", flush=True)
    """
)


@pytest.fixture
def cache_copy(tmp_path):
    """A private MATE cache holding a copy of this machine's built kernel (no rebuild needed)."""
    if not mate_cpu_kernel.available():
        pytest.skip(f"the CPU kernel does not build here: {mate_cpu_kernel.unavailable_reason()}")
    built = mate_cpu_kernel.build_dir()
    target = tmp_path / "cache" / built.relative_to(built.parents[1])
    shutil.copytree(built, target, ignore=shutil.ignore_patterns("lock", ".mate-build.flock"))
    return tmp_path / "cache", target


def load_in_subprocess(cache) -> subprocess.CompletedProcess:
    env = dict(os.environ, MATE_CACHE_DIR=str(cache), MATE_CPU_KERNEL="1")
    return subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=240)


def test_a_stale_lock_left_by_a_killed_build_is_removed_not_waited_on(cache_copy):
    cache, build = cache_copy
    (build / "lock").write_text("")  # what torch leaves when its build is killed
    proc = load_in_subprocess(cache)  # before: waits forever (the timeout fails the test)
    assert proc.stdout.strip() == "loaded", proc.stderr[-2000:]
    assert "stale build lock" in proc.stderr
    assert "building it again" not in proc.stderr  # the copy's library matches the digest its build recorded
    assert not (build / "lock").exists()


def test_a_live_builder_is_waited_for_and_said_once(cache_copy):
    """The holder keeps the build lock until the loader has said it waits (not for a fixed
    time, which a slow machine can outlast before the loader even starts)."""
    cache, build = cache_copy
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import fcntl, select, sys
            handle = open({str(build / ".mate-build.flock")!r}, "a+")
            fcntl.flock(handle, fcntl.LOCK_EX)
            print("held", flush=True)
            select.select([sys.stdin], [], [], 120)  # released when the test says so (at most 2 minutes)
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    env = dict(os.environ, MATE_CACHE_DIR=str(cache), MATE_CPU_KERNEL="1")
    loader = subprocess.Popen(
        [sys.executable, "-c", LOAD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    said = [loader.stderr.readline()]
    while "waiting for another process" not in said[-1] and said[-1] and loader.poll() is None:
        said.append(loader.stderr.readline())
    holder.communicate("release\n", timeout=30)
    out, rest = loader.communicate(timeout=240)
    stderr = "".join(said) + rest
    assert out.strip() == "loaded", stderr[-2000:]
    assert stderr.count("waiting for another process") == 1, stderr[-2000:]


#: a library whose code runs as it is loaded: it writes the file named by PLANTED_MARKER
PLANTED = """
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void ran(void) {
    FILE *f = fopen(getenv("PLANTED_MARKER"), "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


@pytest.fixture
def planted(cache_copy, tmp_path):
    """The copied build with its library replaced by another one (a botched copy, or someone else's code)."""
    cache, build = cache_copy
    source = tmp_path / "planted.c"
    source.write_text(PLANTED)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the planted library")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(build / "mate_bucketed_cpu.so"), str(source)], check=True)
    return cache, build, tmp_path / "marker"


def test_a_library_other_than_the_one_built_there_is_never_loaded_but_built_again(planted):
    """The library's bytes differ from the digest its build recorded: it is removed and built again (with a compiler
    that fails at once here, so the test does not wait for a real build), and its code never runs."""
    cache, build, marker = planted
    env = dict(os.environ, MATE_CACHE_DIR=str(cache), MATE_CPU_KERNEL="1", PLANTED_MARKER=str(marker), CXX="false")
    proc = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=240)
    assert not marker.exists(), "the planted library's code ran"
    assert proc.stdout.strip() == "unavailable", proc.stderr[-2000:]  # the build with CXX=false failed
    assert "is not the library built there" in proc.stderr and "building it again" in proc.stderr, proc.stderr
    assert not (build / "mate_bucketed_cpu.so").exists()


def test_a_build_folder_of_this_users_that_others_can_write_is_made_private_and_built_again(planted):
    """A umask of 002 made the folder group-writable: it is this user's, so its ``go-w`` is taken, and what it holds,
    which others could have put there, is built again (here with a compiler that fails at once), never loaded."""
    cache, build, marker = planted
    build.chmod(0o777)
    env = dict(os.environ, MATE_CACHE_DIR=str(cache), MATE_CPU_KERNEL="1", PLANTED_MARKER=str(marker), CXX="false")
    proc = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=240)
    assert not marker.exists(), "the planted library's code ran"
    assert f"{build} could be written by its group or others; made private" in proc.stderr, proc.stderr
    assert "building it again" in proc.stderr and not (build / "mate_bucketed_cpu.so").exists(), proc.stderr
    assert build.stat().st_mode & 0o777 == 0o755


def test_a_build_folder_of_another_users_is_refused_in_one_warning(planted):
    cache, build, marker = planted
    if os.geteuid() != 0:
        pytest.skip("giving the folder to another user takes root")
    os.chown(build, 65534, 65534)  # nobody's
    env = dict(os.environ, MATE_CACHE_DIR=str(cache), MATE_CPU_KERNEL="1", PLANTED_MARKER=str(marker))
    proc = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=240)
    assert not marker.exists(), "the planted library's code ran"
    assert proc.stdout.strip() == "unavailable", proc.stderr[-2000:]
    (warning,) = [line for line in proc.stderr.splitlines() if "unavailable" in line]
    assert f"{build} is owned by another user (uid 65534)" in warning and "TORCH_EXTENSIONS_DIR" in warning, warning
    assert (build / "mate_bucketed_cpu.so").exists()  # refused, not removed: the folder is not this user's
