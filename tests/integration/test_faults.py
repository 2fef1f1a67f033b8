"""Fault injection: each fault a careless user or a broken machine causes is one
`mate: error:` line and exit status 2 (or a counted skip), nothing is cached from a bad
input, and nothing is written outside the run dir and the cache.

Real parts throughout: the bundled samples, the real readers and cache, the real CLI in
subprocesses. A full disk and a read-only cache are real too: a size-limited tmpfs and a
read-only bind mount in a private user and mount namespace (``unshare -rm``); those
tests skip where the kernel does not allow such namespaces.
"""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from mate_cli.data.corpus import read_jsonl
from mate_cli.data.sqa import SQAReader
from mate_cli.data.tabfact import TabFactReader
from mate_cli.errors import MateError
from mate_cli.pretrained import load_weights_only
from mate_cli.run.resume import AtomicCheckpointIO
from tests.helpers import MATE, REPO_ROOT, mate_env, one_error_line, run_mate
from tests.inprocess import compose_command, run_command

SQA = REPO_ROOT / "data" / "sqa_sample"
TABFACT = REPO_ROOT / "data" / "tabfact_sample"


def mate_error(call, *args) -> str:
    """The one line of the `MateError` that ``call(*args)`` raises (what `mate` prints after
    ``mate: error:`` and exits 2 with: tests/integration/test_cli.py checks that mapping)."""
    with pytest.raises(MateError) as err:
        call(*args)
    line = str(err.value)
    assert "\n" not in line, line
    return line


def cached_entries(cache: Path) -> list[Path]:
    """Finished cache entries (not temp folders, not the kernel build)."""
    return [p for p in cache.rglob("*") if p.is_dir() and not p.name.startswith(".") and (p / "state.json").is_file()]


def namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_namespaces = pytest.mark.skipif(not namespaces_work(), reason="unshare -rm (user + mount namespaces) unavailable")


#: a training run as small as a process test needs: a few questions, short sequences
SMALL = ["dataset.limit_questions=8", "dataset.max_length=128"]


def in_namespace(setup: str, args: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    """``mate <args>`` after the shell lines ``setup`` (mounts), in a private namespace."""
    script = f"{setup} && exec {shlex.quote(MATE)} {' '.join(shlex.quote(a) for a in args)}"
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=timeout
    )


# ------------------------------------------------------------------ empty and broken inputs
def copy_sqa(tmp_path: Path) -> Path:
    root = tmp_path / "sqa"
    shutil.copytree(SQA, root)
    return root


@pytest.mark.parametrize(
    "content", ["", "id\tannotator\tposition\tquestion\ttable_file\tanswer_coordinates\tanswer_text\n"]
)
def test_an_empty_question_file_is_one_line_and_nothing_is_cached(tmp_path, content):
    root = copy_sqa(tmp_path)
    (root / "train.tsv").write_text(content)
    line = mate_error(
        run_command,
        "train",
        [
            "experiment=sqa_mate",
            f"dataset.root={root}",
            "trainer.max_steps=1",
            "logger=csv",
            f"dataset.cache_dir={tmp_path / 'cache'}",
        ],
        tmp_path / "run",
    )
    assert str(root / "train.tsv") in line and ("no questions" in line or "header" in line), line
    assert not cached_entries(tmp_path / "cache")


def test_an_empty_hybridqa_question_file_is_refused_by_the_reader(tmp_path):
    from mate_cli.data.hybridqa import HybridQAReader

    root = tmp_path / "hybridqa"
    shutil.copytree(REPO_ROOT / "data" / "hybridqa_sample", root)
    target = next((root / "released_data").glob("dev*.json"))
    target.write_text("[]")
    with pytest.raises(MateError, match="holds no questions"):
        list(HybridQAReader(root).questions(target.name.split(".")[0]))


@pytest.mark.parametrize(
    "content, names",
    [
        (b"", ["holds no examples"]),
        (b"\n  \n\n", ["holds no examples"]),
        (b'{"text": "caf\xe9", "table": {"header": ["a"], "rows": [["1"]]}}\n', [":1:", "0xe9", "UTF-8"]),
        (b'{"text": "ok", "table": {"header": ["a"], "rows": [["1"]]}}\n{"text": \xff}\n', [":2:", "0xff"]),
    ],
)
def test_a_corpus_that_is_empty_or_not_utf8_is_one_line_naming_file_and_line(tmp_path, content, names):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(content)
    with pytest.raises(MateError) as err:
        list(read_jsonl(corpus))
    assert str(corpus) in str(err.value) and all(n in str(err.value) for n in names), err.value


@pytest.mark.parametrize(
    "content, names",
    [
        (b"", ["holds no examples"]),
        (b'{"text": "caf\xe9", "table": {"header": ["a"], "rows": [["1"]]}}\n', [":1:", "UTF-8"]),
    ],
)
def test_an_empty_or_non_utf8_corpus_through_mate_pretrain(tmp_path, content, names):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(content)
    line = mate_error(
        run_command,
        "pretrain",
        [
            "dataset=pretrain_jsonl",
            f"dataset.sources.jsonl={corpus}",
            "trainer.max_steps=1",
            "logger=csv",
            f"dataset.cache_dir={tmp_path / 'cache'}",
        ],
        tmp_path / "run",
    )
    assert str(corpus) in line and all(name in line for name in names), line
    assert not cached_entries(tmp_path / "cache")


def test_an_sqa_coordinate_outside_its_table_names_file_line_and_value(tmp_path):
    root = copy_sqa(tmp_path)
    lines = (root / "train.tsv").read_text().split("\n")
    lines[2] = lines[2].replace("['(3, 3)']", "['(3, 99)']")
    (root / "train.tsv").write_text("\n".join(lines))
    with pytest.raises(MateError) as err:
        list(SQAReader(root).questions("train.tsv"))
    assert "train.tsv: line 3" in str(err.value) and "(3, 99)" in str(err.value) and "columns" in str(err.value)


def test_a_comma_separated_tabfact_table_is_one_line(tmp_path):
    root = tmp_path / "tabfact"
    shutil.copytree(TABFACT, root)
    table = next((root / "data" / "all_csv").glob("*.csv"))
    table.write_text(table.read_text().replace("#", ","))
    with pytest.raises(MateError) as err:
        TabFactReader(root).table(table.name)
    assert str(table) in str(err.value) and "line 1" in str(err.value) and "'#'-separated" in str(err.value)


def test_a_file_that_is_not_weights_only_is_one_line(tmp_path):
    import argparse

    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "extra": argparse.Namespace(a=1)}, path)
    for load in (
        lambda: load_weights_only(path, "pass a checkpoint written by mate"),
        lambda: AtomicCheckpointIO().load_checkpoint(path),
    ):
        with pytest.raises(MateError) as err:
            load()
        message = str(err.value)
        assert "\n" not in message and str(path) in message and "argparse.Namespace" in message, message


def test_resuming_from_a_checkpoint_that_is_not_weights_only_is_one_line(tmp_path):
    import argparse

    ckpt = tmp_path / "crafted.ckpt"
    torch.save({"state_dict": {}, "extra": argparse.Namespace(a=1)}, ckpt)
    line = mate_error(
        run_command,
        "train",
        [
            "experiment=sqa_mate",
            f"ckpt_path={ckpt}",
            "trainer.max_steps=1",
            "logger=csv",
            f"dataset.cache_dir={tmp_path / 'cache'}",
        ],
        tmp_path / "run",
    )
    assert str(ckpt) in line and "beyond tensors" in line, line
    assert not cached_entries(tmp_path / "cache")  # refused before any data was prepared


def test_a_run_id_a_shared_wandb_service_still_holds_after_a_kill_is_one_line(tmp_path, monkeypatch):
    """A W&B service shared through WANDB_SERVICE keeps the run id of a client killed with
    SIGKILL; resuming that run through it is one line naming the id and the fix."""
    import os
    import sys

    import wandb

    from mate_cli.trainer.wandb_logger import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    wandb.setup().ensure_service()  # this process's service: W&B names it in WANDB_SERVICE for children
    assert os.environ.get("WANDB_SERVICE")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, wandb; wandb.init(id='held0001', dir=sys.argv[1], "
            "settings=wandb.Settings(silent=True)); print('ready', flush=True); time.sleep(300)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
    finally:
        holder.kill()
        holder.wait()
    logger = WandbLogger(id="held0001", offline=True, save_dir=str(tmp_path))
    line = mate_error(lambda: logger.experiment)
    assert "held0001" in line and "WANDB_SERVICE" in line and "wandb beta core stop" in line, line
    assert wandb.run is None


def test_wandb_online_without_an_api_key_or_a_network_is_one_line_saying_what_to_do(tmp_path):
    """``logger.wandb.offline=false`` with W&B's server out of reach (a closed port here, as with no network), or
    with no API key: one line and FAILED saying to `wandb login` or to log offline, exit 2, before W&B's own
    ``init_timeout`` (set to 600 s here) would have run out; the API key written nowhere. Both from mate's own
    process, as a user starts it: HOME, W&B's config and netrc are this test's, so a real login here is never read.

    Over 20 s: two real processes (run side by side).
    """
    import socket

    key = "0123456789abcdef" * 2 + "01234567"  # no real key: the form of one
    closed, listening = socket.socket(), socket.socket()
    closed.bind(("127.0.0.1", 0))
    listening.bind(("127.0.0.1", 0))
    listening.listen()  # the kernel accepts connections for it: reachable (W&B never gets past its key check)
    cases = {
        "no-network": ({"WANDB_API_KEY": key}, closed.getsockname()[1], "cannot be reached from here"),
        "no-key": ({}, listening.getsockname()[1], "No API key"),
    }
    closed.close()
    procs, started = {}, time.monotonic()
    try:
        for name, (extra, port, _) in cases.items():
            env = mate_env(tmp_path / name / "outputs", tmp_path / "cache", HOME=str(tmp_path / name / "home"),
                           WANDB_CONFIG_DIR=str(tmp_path / name / "config"),
                           WANDB_BASE_URL=f"http://127.0.0.1:{port}", WANDB_INIT_TIMEOUT="600")  # fmt: skip
            for unset in ("WANDB_MODE", "WANDB_API_KEY", "NETRC", *(k for k in env if k.lower().endswith("_proxy"))):
                env.pop(unset, None)
            env.update(extra)
            args = ["train", "experiment=hybridqa_mate", "logger=wandb", "logger.wandb.offline=false",
                    f"hydra.run.dir={tmp_path / name / 'run'}"]  # fmt: skip
            procs[name] = subprocess.Popen([MATE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True)  # fmt: skip
        done = {name: proc.communicate(timeout=300) for name, proc in procs.items()}
    finally:
        listening.close()
        for proc in procs.values():
            proc.kill()
    assert time.monotonic() - started < 240, "waited for W&B's init_timeout (600 s here)"
    for name, (out, err) in done.items():
        run, (_, port, why) = tmp_path / name / "run", cases[name]
        line = one_error_line(subprocess.CompletedProcess([], procs[name].returncode, out, err), 2,
                              "mate: error: logger.wandb.offline=false: W&B cannot start run")  # fmt: skip
        assert why in line and "`wandb login`" in line and "logger.wandb.offline=true" in line, line
        assert "WANDB_MODE=offline" in line, line
        assert (run / "FAILED").read_text().strip() == line
        written = [path for path in run.rglob("*") if path.is_file() and key.encode() in path.read_bytes()]
        assert key not in out + err and not written, written


# ------------------------------------------------------------------ the machine
@needs_namespaces
def test_a_full_disk_is_one_line_naming_the_folder_and_its_free_space(tmp_path):
    """Over 20 s: a real process on a size-limited tmpfs in its own namespace."""
    run = tmp_path / "run"
    run.mkdir()
    env = mate_env(tmp_path / "outputs", tmp_path / "cache")
    proc = in_namespace(
        f"mount -t tmpfs -o size=8m tmpfs {shlex.quote(str(run))}",
        ["train", "experiment=sqa_mate", "trainer.max_steps=1", "logger=csv", *SMALL, f"hydra.run.dir={run}"],
        env,
    )
    line = one_error_line(proc)
    assert "no space left on the device of" in line and str(run) in line and "free" in line, line


@needs_namespaces
def test_a_full_disk_anywhere_in_an_errors_chain_is_named_with_its_free_space(tmp_path):
    """torch reports a failed write as a RuntimeError ("unexpected pos ...") caused by the
    OSError: the one line names the file and the free space of its folder; an error with
    no full disk in its chain is none."""
    import errno

    from mate_cli.run.job import full_disk

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "last.ckpt"))
        except OSError as cause:
            raise RuntimeError("unexpected pos 57152 vs 57046") from cause
    except RuntimeError as err:
        line = str(full_disk(err))
    assert f"device of {tmp_path} (" in line and " free) while writing last.ckpt" in line, line
    assert line.endswith("resume the run with ckpt_path=<run dir>"), line
    assert full_disk(RuntimeError("no OSError in here")) is None
    assert full_disk(OSError(errno.EACCES, "Permission denied")) is None


def test_a_read_only_cache_works_in_memory_with_one_warning(tmp_path):
    """Over 20 s: a real run in a read-only mount namespace."""
    cache = tmp_path / "cache"
    cache.mkdir()
    env = mate_env(tmp_path / "outputs", cache)
    proc = in_namespace(
        f"mount --bind -o ro {shlex.quote(str(cache))} {shlex.quote(str(cache))}",
        ["train", "experiment=sqa_mate", "trainer.max_steps=1", "logger=csv", "attention=dense", *SMALL],
        env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "cannot be written" in line]
    assert len(warnings) == 1, warnings
    assert not any(cache.iterdir())


@needs_namespaces
def test_a_read_only_cache_with_a_built_kernel_loads_it(tmp_path):
    from mate_cli.modeling.attention.mate import cpu_kernel as mate_cpu_kernel

    if not mate_cpu_kernel.load():
        pytest.skip(f"fused CPU kernel unavailable: {mate_cpu_kernel.unavailable_reason()}")
    cache = mate_cpu_kernel.build_dir().parent.parent  # the cache dir holding torch_extensions/
    probe = (
        "from mate_cli.modeling.attention.mate import cpu_kernel as m; "
        "assert m.load(), m.unavailable_reason(); print('loaded')"
    )
    script = (
        f"mount --bind -o ro {shlex.quote(str(cache))} {shlex.quote(str(cache))} && "
        f"exec {shlex.quote(str(Path(MATE).parent / 'python'))} -c {shlex.quote(probe)}"
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=mate_env(tmp_path / "outputs", cache),
    )
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stderr[-3000:]
    assert "unavailable" not in proc.stderr


# ------------------------------------------------------------------ run directories
def test_a_second_process_in_a_run_dir_is_refused_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    env = mate_env(tmp_path / "outputs", tmp_path / "cache")
    first = subprocess.Popen(
        [MATE, "train", "experiment=sqa_mate", "trainer.max_steps=200", "logger=csv", f"hydra.run.dir={run}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        written = [run / ".hydra" / "overrides.yaml", run / "resolved_config.yaml"]  # Hydra's last file, then mate's
        deadline = time.time() + 120
        while not all(path.is_file() for path in written) and time.time() < deadline:
            time.sleep(0.2)
        assert all(path.is_file() for path in written)
        before = {p: p.read_bytes() for p in (run / ".hydra").iterdir()}
        line = one_error_line(run_mate(["train", "experiment=sqa_tapas", "logger=csv", f"hydra.run.dir={run}"], env))
        assert str(run) in line and f"pid {first.pid}" in line and "in use" in line, line
        assert {p: p.read_bytes() for p in (run / ".hydra").iterdir()} == before
        assert not (run / "FAILED").exists()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()


def test_stale_temp_files_are_removed_when_a_run_dir_is_taken_again(tmp_path):
    """The temp files a killed mate process left (its own names, its pid gone) do not make a
    folder another run's: the run takes it and removes them."""
    import socket

    gone = subprocess.Popen(["true"])
    gone.wait()
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    host = socket.gethostname()
    stale = [
        run / "checkpoints" / f".last.ckpt.mate~{host}~{gone.pid}~k3j2.tmp",
        run / f".metrics.json.mate~{host}~{gone.pid}~x9.tmp",
    ]
    for path in stale:
        path.write_bytes(b"half a checkpoint")
    proc = run_mate(["baseline", "dataset=sqa_sample", f"hydra.run.dir={run}"], mate_env(tmp_path / "outputs"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not any(path.exists() for path in stale)


def test_runs_started_in_the_same_second_get_their_own_dirs(tmp_path):
    """Over 20 s: real processes started at once (the race is the point)."""
    env = mate_env(tmp_path / "outputs")
    procs = [
        subprocess.Popen(
            [MATE, "baseline", "dataset=sqa_sample"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
    runs = sorted((tmp_path / "outputs" / "baseline").iterdir())
    assert len(runs) == 2 and all((run / "metrics.json").is_file() for run in runs), runs


# ------------------------------------------------------------------ corrupted dataset files
def _sqa_line(root: Path, index: int, old: str, new: str) -> None:
    lines = (root / "train.tsv").read_text().split("\n")
    lines[index] = lines[index].replace(old, new, 1)
    (root / "train.tsv").write_text("\n".join(lines))


def _sqa_truncate_last(root: Path) -> None:
    text = (root / "train.tsv").read_text().rstrip("\n")
    (root / "train.tsv").write_text(text[: text.rfind("\t")] + "\n")


def _sqa_questions(root: Path) -> list:
    return list(SQAReader(root).questions("train.tsv"))


def _tabfact_questions(root: Path) -> list:
    reader = TabFactReader(root)
    return [q for name in reader.available_files() for q in reader.questions(name)]


def _tabfact_edit(root: Path, edit) -> None:
    import json

    path = root / "tokenized_data" / "val_examples.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _hybridqa_question_file(root: Path) -> Path:
    from mate_cli.data.hybridqa import HybridQAReader

    return HybridQAReader(root).question_file("dev")


def _hybridqa_questions(root: Path) -> list:
    from mate_cli.data.hybridqa import HybridQAReader

    reader = HybridQAReader(root)
    return [reader.table(q.table_id) for q in reader.questions("dev")]


def _first_key(data: dict) -> str:
    return next(iter(data))


CORRUPTIONS = {
    "sqa: truncated line": ("sqa", _sqa_truncate_last, _sqa_questions, "train.tsv"),
    "sqa: bad quoting": ("sqa", lambda r: _sqa_line(r, 1, "\twhat are", '\t"what are'), _sqa_questions, "train.tsv"),
    "sqa: missing column": ("sqa", lambda r: _sqa_line(r, 0, "\tquestion\t", "\tquery\t"), _sqa_questions, "question"),
    "sqa: non-UTF-8": (
        "sqa",
        lambda r: (r / "train.tsv").write_bytes((r / "train.tsv").read_bytes().replace(b"what", b"wh\xffat", 1)),
        _sqa_questions,
        "UTF-8",
    ),
    "sqa: conflicting duplicate id": (
        "sqa",
        lambda r: _sqa_line(r, 2, "\t1\t", "\t0\t"),
        _sqa_questions,
        "appears twice",
    ),
    "sqa: out-of-range coordinate": (
        "sqa",
        lambda r: _sqa_line(r, 2, "['(3, 3)']", "['(300, 3)']"),
        _sqa_questions,
        "(300, 3)",
    ),
    "sqa: bad coordinate": (
        "sqa",
        lambda r: _sqa_line(r, 2, "['(3, 3)']", "['(3, x)']"),
        _sqa_questions,
        "(row, column)",
    ),
    "sqa: empty table": (
        "sqa",
        lambda r: (r / "table_csv" / "204_195.csv").write_text(""),
        _sqa_questions,
        "204_195.csv",
    ),
    "sqa: missing table file": (
        "sqa",
        lambda r: (r / "table_csv" / "204_195.csv").unlink(),
        _sqa_questions,
        "204_195.csv",
    ),
    "tabfact: truncated JSON": (
        "tabfact",
        lambda r: (r / "tokenized_data" / "val_examples.json").write_text(
            (r / "tokenized_data" / "val_examples.json").read_text()[:300]
        ),
        _tabfact_questions,
        "val_examples.json",
    ),
    "tabfact: bad label": (
        "tabfact",
        lambda r: _tabfact_edit(r, lambda d: d[_first_key(d)][1].__setitem__(0, 2)),
        _tabfact_questions,
        "val_examples.json",
    ),
    "tabfact: one label too few": (
        "tabfact",
        lambda r: _tabfact_edit(r, lambda d: d[_first_key(d)][1].pop()),
        _tabfact_questions,
        "one label per statement",
    ),
    "hybridqa: truncated JSON": (
        "hybridqa",
        lambda r: _hybridqa_question_file(r).write_text(_hybridqa_question_file(r).read_text()[:500]),
        _hybridqa_questions,
        "dev",
    ),
    "hybridqa: missing key": (
        "hybridqa",
        lambda r: _hybridqa_question_file(r).write_text(
            _hybridqa_question_file(r).read_text().replace('"question":', '"querstion":', 1)
        ),
        _hybridqa_questions,
        "dev",
    ),
    "hybridqa: missing table file": (
        "hybridqa",
        lambda r: (r / "WikiTables-WithLinks" / "tables_tok" / "Marine_defense_battalions_0.json").unlink(),
        _hybridqa_questions,
        "Marine_defense_battalions_0",
    ),
}

SAMPLES = {"sqa": SQA, "tabfact": TABFACT, "hybridqa": REPO_ROOT / "data" / "hybridqa_sample"}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupted_dataset_file_is_one_line_naming_it(tmp_path, case):
    kind, corrupt, read, names = CORRUPTIONS[case]
    root = tmp_path / kind
    shutil.copytree(SAMPLES[kind], root)
    corrupt(root)
    with pytest.raises(MateError) as err:
        read(root)
    message = str(err.value)
    assert "\n" not in message and names in message, message
    assert str(root) in message or "dataset" in message, message


def test_an_identical_duplicate_record_is_a_counted_skip(tmp_path):
    root = tmp_path / "sqa"
    shutil.copytree(SQA, root)
    lines = (root / "train.tsv").read_text().split("\n")
    (root / "train.tsv").write_text("\n".join([*lines[:2], lines[1], *lines[2:]]))
    reader = SQAReader(root)
    assert len(list(reader.questions("train.tsv"))) == len(list(SQAReader(SQA).questions("train.tsv")))
    assert reader.skipped["train.tsv"]["duplicate_records"] == 1


@pytest.mark.parametrize("shape", ["5000 rows", "300 columns", "1 MB cell"])
def test_huge_tables_and_cells_are_read_and_truncated_to_the_budget(tmp_path, shape):
    """Long tables and cells are read whole and truncated to the token budget; a header
    that alone passes the budget is one line naming the table and the two settings.

    The 1 MB cell takes over 20 s: reading and cutting it is the point.
    """
    from mate_cli.data.records import Question
    from mate_cli.data.sqa import parse_table_file
    from mate_cli.data.tokenize import TableTokenizer
    from mate_cli.pretrained import load_tokenizer

    rows, columns, cell = {
        "5000 rows": (5000, 4, "x"),
        "300 columns": (3, 300, "y"),
        "1 MB cell": (2, 2, "word " * 200_000),
    }[shape]
    path = tmp_path / "big.csv"
    body = [",".join(f"h{c}" for c in range(columns))] + [",".join([cell] * columns) for _ in range(rows)]
    path.write_text("\n".join(body) + "\n")
    table = parse_table_file(path, "big.csv")
    assert (table.num_rows, table.num_columns) == (rows, columns)
    tokenizer = TableTokenizer(load_tokenizer("minilm"), max_length=256, max_question_tokens=32)
    question = Question(question_id="q", question="how many?", table_id="big.csv")
    if shape == "300 columns":
        with pytest.raises(MateError) as err:
            tokenizer.encode(question, table)
        assert "big.csv" in str(err.value) and "dataset.max_length" in str(err.value)
        return
    encoded = tokenizer.encode(question, table)
    assert len(encoded.input_ids) <= 256 and encoded.truncated


# ------------------------------------------------------------------ one line, or read, where a traceback was
@pytest.mark.parametrize(
    "sweep", ["seed=range(0,0)", "seed=choice()", "seed=shuffle()", "seed=range(3,0)", "attention=glob(nothing*)"]
)
def test_a_sweep_of_no_value_is_one_line(sweep):
    from mate_cli.config.check import check_command_line

    problem = check_command_line("train", ["-m", sweep])
    assert problem.startswith(f"{sweep} sweeps no value") and "\n" not in problem, problem


def test_the_overrides_beside_a_run_dir_are_checked_against_its_config(tmp_path):
    from mate_cli.config.check import check_run_patches

    (tmp_path / "resolved_config.yaml").write_text("dataset:\n  eval_batch_size: 8\n")
    check_run_patches({"ckpt_path": str(tmp_path), "overrides": ["dataset.eval_batch_size=2"]})
    with pytest.raises(
        MateError, match=r"^stage1\.overrides: dataset\.eval_batchsize=2: .*did you mean dataset\.eval_batch_size"
    ):
        check_run_patches({"stage1": {"ckpt_path": str(tmp_path), "overrides": ["dataset.eval_batchsize=2"]}})


@pytest.mark.parametrize(
    "args",
    [
        ["ckpt_path={run}", "overrides=['dataset.eval_batchsize=2']"],
        ["stage1={{ckpt_path:{run},overrides:['dataset.eval_batchsize=2']}}", "stage2.ckpt_path=null"],  # the node
    ],
)
def test_a_run_s_overrides_given_on_the_command_line_are_checked_before_it_runs(tmp_path, args):
    """Where the command line sets a run's patches (a key, or the node that holds them), its values are composed
    for the check too, so a patch's unknown key is one line before anything loads."""
    (tmp_path / "resolved_config.yaml").write_text("dataset:\n  eval_batch_size: 8\n")
    from mate_cli.config.check import check_command_line

    command = "eval" if args[0].startswith("ckpt_path") else "pointr"
    problem = check_command_line(command, [arg.format(run=tmp_path) for arg in args])
    assert problem and "overrides: dataset.eval_batchsize=2" in problem and "dataset.eval_batch_size" in problem


def test_deleting_a_key_by_a_value_it_does_not_hold_is_one_line():
    from mate_cli.config.check import check_command_line

    problem = check_command_line("train", ["~seed=3"])
    assert "The value of 'seed' is 42 and not 3" in problem and "\n" not in problem, problem


def test_a_sweep_job_with_long_overrides_gets_a_folder_every_file_system_takes(tmp_path):
    from omegaconf import OmegaConf

    cfg = compose_command("train", ["seed=1"])
    OmegaConf.set_readonly(cfg.hydra, False)  # the job's fields as a sweeper sets them
    folders = []
    for end in "xy":
        cfg.hydra.job.num, cfg.hydra.job.override_dirname = 12, f"experiment_name={'é' * 299}{end},seed=1"
        folders.append(str(cfg.hydra.sweep.subdir))
    assert all(len(folder.encode()) <= 255 and folder.startswith("12-experiment_name=é") for folder in folders)
    assert folders[0] != folders[1], folders
    cfg.hydra.job.override_dirname = "seed=1"
    assert cfg.hydra.sweep.subdir == "12-seed=1"


def test_a_corpus_with_a_byte_order_mark_is_read(tmp_path):
    line = '{"text": "t", "table": {"header": ["a"], "rows": [["1"]]}}\n'
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b"\xef\xbb\xbf" + (line * 2).encode())
    assert [example.table.header[0].text for example in read_jsonl(corpus)] == ["a", "a"]


def test_a_pointr_reference_folder_or_byte_order_mark(tmp_path):
    from collections import Counter

    from mate_cli.pipelines.pointr import reference_for, score

    with pytest.raises(MateError, match=f"^reference={tmp_path} is a folder, not a file; pass the dev_reference"):
        reference_for(str(tmp_path), None, "validation")
    reference = tmp_path / "dev_reference.json"
    reference.write_bytes(b"\xef\xbb\xbf" + b'{"reference": {}, "table": [], "passage": []}')
    assert score([], {}, reference_for(str(reference), None, "validation"), Counter())["reference"] == str(reference)
    reference.write_text('{"reference": ')
    with pytest.raises(MateError, match=r"dev_reference\.json: reference file is not valid JSON \(line 1"):
        score([], {}, reference, Counter())


def test_a_run_dir_as_a_stage_checkpoint_loads_its_checkpoint_and_says_which(tmp_path, caplog):
    import logging

    from mate_cli.lit_modules.cell_selection import CellSelectionModule
    from mate_cli.run.rebuild import load_trained

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")  # the run dir is resolved before the file is checked
    with caplog.at_level(logging.INFO), pytest.raises(MateError, match=r"last\.ckpt is empty"):
        load_trained(str(tmp_path), None, CellSelectionModule, "stage1", torch.device("cpu"))
    assert f"stage1.ckpt_path={tmp_path}: loading {tmp_path / 'checkpoints' / 'last.ckpt'}" in caplog.text


def test_a_300_character_experiment_name_gets_a_run_dir_every_file_system_takes(tmp_path):
    from mate_cli.config.naming import dir_name

    long_a, long_b = "a" * 299 + "x", "a" * 299 + "y"
    assert dir_name(long_a) != dir_name(long_b) and len(dir_name("é" * 300).encode()) <= 200
    cfg = compose_command("train", [f"experiment_name={long_a}"])
    run_dir = Path(str(cfg.hydra.run.dir))
    assert all(len(part.encode()) <= 255 for part in run_dir.parts) and long_a[:150] in run_dir.name


@pytest.mark.parametrize("length", [20, 190, 191, 192, 300])
def test_ckpt_path_last_finds_the_run_of_an_experiment_whose_name_was_cut(tmp_path, length):
    import torch

    from mate_cli.config.naming import dir_name
    from mate_cli.run.resume import resolve_resume_path

    experiment = "e" * length
    run = tmp_path / f"2026-01-02_00-00-00-{dir_name(experiment + '-mate-bucketed-sqa_sample-seed42')}-a1b2c3"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {}, "optimizer_states": []}, run / "checkpoints" / "last.ckpt")
    (tmp_path / f"2026-01-03_00-00-00-{dir_name('other-mate-bucketed-sqa_sample-seed42')}-d4e5f6").mkdir()
    assert resolve_resume_path("last", tmp_path, experiment) == str(run / "checkpoints" / "last.ckpt")


def test_an_unwritable_output_folder_is_one_line_before_hydra_writes(tmp_path, monkeypatch, capsys):
    from mate_cli import cli

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("MATE_OUTPUT_DIR", str(blocker / "outputs"))
    assert cli.main(["baseline", "dataset=sqa_sample"]) == 2
    line = capsys.readouterr().err.strip()
    assert line == (
        f"mate: error: cannot write run dirs in {blocker / 'outputs'} (Not a directory); set "
        "MATE_OUTPUT_DIR to a writable folder, or pass hydra.run.dir=<writable folder>"
    )
    assert cli.main(["baseline", "dataset=sqa_sample", f"hydra.run.dir={blocker / 'run'}"]) == 2
    assert f"cannot write run dirs in {blocker / 'run'} (Not a directory)" in capsys.readouterr().err


def test_a_question_file_and_tables_with_a_byte_order_mark_are_read(tmp_path):
    from mate_cli.data.sqa import SQAReader

    root = tmp_path / "sqa"
    shutil.copytree(REPO_ROOT / "data" / "sqa_sample", root)
    for path in [root / "train.tsv", *(root / "table_csv").glob("*.csv")]:
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    with_bom = list(SQAReader(root).questions("train.tsv"))
    plain = list(SQAReader(REPO_ROOT / "data" / "sqa_sample").questions("train.tsv"))
    assert [q.question_id for q in with_bom] == [q.question_id for q in plain] and with_bom
    reader, first = SQAReader(root), with_bom[0]
    assert (
        reader.table(first.table_id).header == SQAReader(REPO_ROOT / "data" / "sqa_sample").table(first.table_id).header
    )


def test_a_folder_given_as_a_table_is_named_as_a_folder(tmp_path):
    from mate_cli.data.hybridqa import read_table_file
    from mate_cli.pipelines.table_task import read_task_table

    for read in (read_table_file, lambda path: read_task_table("sqa", path)):
        with pytest.raises(MateError, match=f"table={tmp_path} is a folder, not a file; pass "):
            read(tmp_path)
