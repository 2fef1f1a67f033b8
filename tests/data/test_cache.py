"""The preprocessing cache under kills, races, corruption and edited inputs (real Arrow files)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading

import datasets
import pytest

from mate_cli.data.cache import load_or_build, remove_stale_temps, save_atomically
from mate_cli.data.datamodule import HybridQADataModule


def dataset(values) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"x": list(values)})


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_writer_of_the_same_entry_keeps_the_first(tmp_path):
    target = tmp_path / "entry"
    save_atomically(dataset([1, 2]), target)
    save_atomically(dataset([3, 4]), target)  # raced: the entry exists when it renames
    assert datasets.load_from_disk(str(target))["x"] == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]


def test_a_run_that_needs_an_entry_being_built_waits_for_it_and_builds_nothing(tmp_path, caplog):
    """Two loads of one entry at once (two threads, two real flocks on the entry's lock file): the second waits while
    the first builds, then loads what the first saved."""
    caplog.set_level(logging.INFO, logger="mate_cli.data.cache")
    target, building, finish = tmp_path / "entry", threading.Event(), threading.Event()
    loaded, second_builds = {}, []

    def slow_build():
        building.set()
        assert finish.wait(60)
        return dataset([1, 2])

    first = threading.Thread(target=lambda: loaded.update(first=load_or_build(target, slow_build, "test")))
    second = threading.Thread(
        target=lambda: loaded.update(second=load_or_build(target, lambda: second_builds.append(1) or dataset([9]), "t"))
    )
    first.start()
    assert building.wait(60)
    second.start()
    for _ in range(600):  # until the second says it waits
        if any("another run is building" in record.getMessage() for record in caplog.records):
            break
        threading.Event().wait(0.05)
    assert not target.exists() and "second" not in loaded  # still building: the second has not gone on
    finish.set()
    first.join(60)
    second.join(60)
    assert second_builds == [] and loaded["first"]["x"] == loaded["second"]["x"] == [1, 2]
    assert any("another run is building" in record.getMessage() for record in caplog.records)


def test_an_entry_whose_lock_cannot_be_had_is_built_unlocked_with_one_warning(tmp_path, caplog):
    (tmp_path / ".entry.lock").symlink_to(tmp_path / "gone" / "lock")  # opening it fails: its folder is not there
    caplog.set_level(logging.WARNING, logger="mate_cli.data.cache")
    assert load_or_build(tmp_path / "entry", lambda: dataset([5]), "test")["x"] == [5]
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "no build lock for" in warning and "building it unlocked" in warning


_BUILD_THEN_DIE = """
import os, sys, time
from pathlib import Path
from mate_cli.data.cache import build_lock
with build_lock(Path(sys.argv[1])):
    if os.fork() == 0:  # a preprocessing worker, still running when its parent is killed
        time.sleep(60)
        os._exit(0)
    print("building", flush=True)
    time.sleep(60)
"""


def test_a_killed_builders_forked_worker_does_not_keep_the_build_lock(tmp_path):
    """A builder killed with ``kill -9`` while its forked worker runs on: the next run may build the entry at once."""
    import fcntl
    import signal

    builder = subprocess.Popen([sys.executable, "-c", _BUILD_THEN_DIE, str(tmp_path / "entry")], stdout=subprocess.PIPE)
    try:
        assert builder.stdout.readline() == b"building\n"
        with open(tmp_path / ".entry.lock", "rb") as lock:
            with pytest.raises(BlockingIOError):
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while the builder lives
            builder.send_signal(signal.SIGKILL)
            builder.wait(60)
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the worker, alive, holds no copy of it
    finally:
        builder.kill()
        builder.wait(60)
        subprocess.run(["pkill", "-KILL", "-f", str(tmp_path / "entry")], check=False)


def test_temp_folders_of_killed_writers_are_removed(tmp_path):
    host = socket.gethostname()
    stale = tmp_path / f".entry.{host}.{dead_pid()}.tmp"
    live = tmp_path / f".other.{host}.{os.getpid()}.tmp"
    elsewhere = tmp_path / f".third.another-node.{dead_pid()}.tmp"  # a pid on another host says nothing here
    for folder in (stale, live, elsewhere):
        folder.mkdir()
        (folder / "data-00000.arrow").write_bytes(b"half")
    assert remove_stale_temps(tmp_path) == 1
    assert not stale.exists() and live.exists() and elsewhere.exists()
    load_or_build(tmp_path / "entry", lambda: dataset([1]), "test")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, elsewhere.name, "entry", ".entry.lock"])


def test_temp_folders_of_killed_writers_are_removed_on_a_host_whose_name_has_dots(tmp_path, monkeypatch):
    """Cluster nodes are often named node1.cluster.local: the name is read from the end (pid), not split on dots."""
    from mate_cli.data import cache

    monkeypatch.setattr(cache.socket, "gethostname", lambda: "node1.cluster.local")
    stale = tmp_path / f".entry.node1.cluster.local.{dead_pid()}.tmp"
    other = tmp_path / f".entry.node2.cluster.local.{dead_pid()}.tmp"
    for folder in (stale, other):
        folder.mkdir()
    assert remove_stale_temps(tmp_path) == 1 and not stale.exists() and other.exists()


def test_a_truncated_entry_is_reported_in_one_line_and_rebuilt(tmp_path, caplog):
    target = tmp_path / "entry"
    save_atomically(dataset(range(1000)), target)
    (arrow,) = target.glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes()[:100])
    caplog.set_level(logging.WARNING, logger="mate_cli.data.cache")
    built = []
    ds = load_or_build(target, lambda: built.append(1) or dataset([7]), "test")
    assert built == [1] and ds["x"] == [7]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    assert "not as it was written" in warnings[0].getMessage() and arrow.name in warnings[0].getMessage()


def test_an_entry_unreadable_past_its_record_is_reported_in_one_line_and_rebuilt(tmp_path, caplog):
    """Files that match their record but do not load (the record rewritten with them) are still rebuilt."""
    from mate_cli.data.cache import RECORD, _file_digests

    target = tmp_path / "entry"
    save_atomically(dataset(range(1000)), target)
    (arrow,) = target.glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes()[:100])
    (target / RECORD).write_text(json.dumps({"key": "entry", "files": _file_digests(target)}))
    caplog.set_level(logging.WARNING, logger="mate_cli.data.cache")
    assert load_or_build(target, lambda: dataset([7]), "test")["x"] == [7]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "unreadable" in warning and "\n" not in warning


def test_the_files_datasets_writes_into_a_loaded_entry_leave_it_proven(tmp_path):
    """``filter`` on an entry loaded from disk (``dataset.drop_ambiguous``) writes its own ``cache-*.arrow`` into the
    entry's folder: not a change of the entry, so the next run loads it, not builds it again."""
    target, built = tmp_path / "entry", []
    load_or_build(target, lambda: built.append(1) or dataset(range(10)), "test").filter(lambda ex: ex["x"] % 2 == 0)
    assert list(target.glob("cache-*.arrow"))  # else this test could not fail
    assert load_or_build(target, lambda: built.append(1) or dataset([0]), "test")["x"] == list(range(10))
    assert built == [1]


@pytest.mark.parametrize("planted", ["another entry", "a smaller one with no record"])
def test_an_entry_whose_folder_holds_other_files_is_rebuilt_not_served(sample_root, tmp_path, caplog, planted):
    """A botched restore or copy of the cache folder: the validation entry's folder holds the training entry's files
    (or a smaller set with no record). The entry's record names its key and its files' digests, so the swap is seen,
    said in one warning, and the split rebuilt: the validation questions are scored, never the training ones."""
    import shutil

    dm = HybridQADataModule(root=str(sample_root), cache_dir=str(tmp_path), limit_questions=4)
    val_ids = sorted(dm.preprocess("validation")["question_id"])
    train = dm.preprocess("train")
    entries = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    entry = {split: next(p for p in entries if f"{split}-" in p.name) for split in ("train", "validation")}
    shutil.rmtree(entry["validation"])
    if planted == "another entry":
        shutil.copytree(entry["train"], entry["validation"])
        assert sorted(train["question_id"]) != val_ids
    else:  # saved as an older mate_cli saved entries: no record
        datasets.Dataset.from_dict(train.select(range(2)).to_dict()).save_to_disk(str(entry["validation"]))
    caplog.set_level(logging.WARNING, logger="mate_cli.data.cache")
    served = dm.preprocess("validation")
    assert sorted(served["question_id"]) == val_ids
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "not as it was written" in warning and entry["validation"].name in warning and "\n" not in warning


@pytest.mark.parametrize("edit", ["table", "passages", "questions"])
def test_the_cache_key_follows_the_input_files(tiny_root, tmp_path, edit):
    dm = HybridQADataModule(root=str(tiny_root), cache_dir=str(tmp_path))
    before = dm.cache_key("train")
    sub = {
        "table": "WikiTables-WithLinks/tables_tok",
        "passages": "WikiTables-WithLinks/request_tok",
        "questions": "released_data",
    }[edit]
    path = sorted((tiny_root / sub).glob("*.json"))[0]
    path.write_text(path.read_text(encoding="utf-8") + " ", encoding="utf-8")
    assert dm.cache_key("train") != before


# ------------------------------------------------------------------ the code that encodes
def package_copy(tmp_path):
    import shutil

    from mate_cli.data.cache import PACKAGE_ROOT

    copy = tmp_path / "mate_cli"
    shutil.copytree(PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return copy


@pytest.mark.parametrize(
    "module, changes",
    [
        ("data/tokenize.py", True),
        ("metrics/wtq.py", True),
        ("errors.py", True),
        ("commands/report.py", False),
        ("report/render.py", False),
    ],
)
def test_the_code_digest_follows_the_modules_the_data_package_imports(tmp_path, module, changes):
    from mate_cli.data.cache import code_digest

    copy = package_copy(tmp_path)
    before = code_digest(copy)
    assert before == code_digest()  # the copy is the installed code
    (copy / module).write_text((copy / module).read_text() + "\nCHANGED = 1\n")
    assert (code_digest(copy) != before) is changes


def test_the_code_digest_follows_relative_imports_and_the_packages_an_import_runs(tmp_path):
    from mate_cli.data.cache import code_digest

    copy = package_copy(tmp_path)
    tokenize = copy / "data" / "tokenize.py"
    tokenize.write_text(tokenize.read_text() + "\nfrom ..report import render  # noqa: E402,F401\n")
    digests = [code_digest(copy)]
    for module in ("report/render.py", "report/__init__.py", "__init__.py"):
        (copy / module).write_text((copy / module).read_text() + "\n# edited\n")
        digests.append(code_digest(copy))
    assert len(set(digests)) == 4


@pytest.mark.parametrize("task", ["hybridqa", "sqa"])
def test_a_change_of_the_encoding_code_rebuilds_the_cache(sample_root, tmp_path, monkeypatch, caplog, task):
    """The same settings and inputs, the code changed: a new entry is built, not the old one served."""
    from mate_cli.data import cache
    from mate_cli.data.table_tasks import TableTaskDataModule

    cache_dir = tmp_path / "cache"
    if task == "hybridqa":
        dm = HybridQADataModule(root=str(sample_root), cache_dir=str(cache_dir), limit_questions=3)
    else:
        dm = TableTaskDataModule(
            task="sqa",
            root=str(sample_root.parent / "sqa_sample"),
            pretrained="minilm",
            split={"source": "train.tsv"},
            cache_dir=str(cache_dir),
            limit_questions=3,
        )
    with caplog.at_level(logging.INFO):
        dm.preprocess("train")
        dm.preprocess("train")
    assert caplog.text.count("loaded from cache") == 1
    copy = package_copy(tmp_path)
    (copy / "data" / "expand.py").write_text((copy / "data" / "expand.py").read_text() + "\n# a fix\n")
    monkeypatch.setattr(cache, "PACKAGE_ROOT", copy)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        dm.preprocess("train")
    assert "loaded from cache" not in caplog.text
    assert len([p for p in cache_dir.iterdir() if "train-" in p.name and not p.name.startswith(".")]) == 2


def test_the_cache_key_follows_the_tokenizers_files_by_content(tiny_root, tmp_path, minilm_dir):
    """A tokenizer edited in place (lowercasing off) encodes differently: its entries must not be served."""
    import json
    import shutil

    encoder = tmp_path / "enc"
    shutil.copytree(minilm_dir, encoder)
    dm = HybridQADataModule(root=str(tiny_root), cache_dir=str(tmp_path / "cache"), pretrained=str(encoder))
    before = dm.cache_key("train")
    config = encoder / "tokenizer_config.json"
    settings = json.loads(config.read_text(encoding="utf-8"))
    settings["do_lower_case"] = not settings.get("do_lower_case", True)
    config.write_text(json.dumps(settings), encoding="utf-8")
    changed = dm.cache_key("train")
    assert changed != before
    os.utime(config, ns=(0, 0))  # the same bytes at another time: the same key
    assert dm.cache_key("train") == changed
