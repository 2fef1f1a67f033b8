"""Bad input through the real CLI: one `mate: error:` line naming the key or file and
the fix, exit status 2, and nothing built or written before the check."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import mate_env, run_mate


def mate(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    return run_mate(args, mate_env(tmp / "outputs", tmp / "cache"), timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mate: error: "), proc.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    "override, names",
    [
        ("trainer.max_steps=abc", ["trainer.max_steps", "int"]),
        ("+trainer.max_stepz=3", ["trainer.max_stepz", "max_steps"]),
        ("trainer.max_stepz=3", ["trainer.max_stepz", "max_steps"]),
        ("+trainer.callbacks=[]", ["trainer.callbacks", "callbacks"]),
    ],
)
def test_bad_trainer_arguments_fail_before_anything_is_built(tmp_path, override, names):
    line = one_error_line(mate(["train", "experiment=hybridqa_mate", override], tmp_path))
    assert all(name in line for name in names), line
    assert not (tmp_path / "cache").exists()  # no preprocessing happened


def test_any_trainer_argument_works_without_a_plus(tmp_path):
    proc = mate(["train", "--cfg", "job", "trainer.limit_val_batches=2", "trainer.max_steps=5"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "limit_val_batches: 2" in proc.stdout and "max_steps: 5" in proc.stdout


def test_an_unknown_experiment_is_one_line_with_the_options(tmp_path):
    line = one_error_line(mate(["train", "experiment=nope"], tmp_path))
    assert "experiment=nope" in line and "hybridqa_mate" in line and "hybridqa_tapas" in line


def test_an_unknown_backend_in_a_sweep_is_caught_too(tmp_path):
    line = one_error_line(mate(["train", "-m", "attention=mate,dnese"], tmp_path))
    assert "attention=dnese" in line and "dense" in line


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", "truncated"])
@pytest.mark.parametrize("command", ["eval", "predict", "pointr"])
def test_a_broken_checkpoint_is_named_before_data_and_model_are_built(tmp_path, command, content):
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    if content == "truncated":
        import torch

        torch.save({"state_dict": {"w": torch.zeros(1000)}}, ckpt)
        ckpt.write_bytes(ckpt.read_bytes()[:-200])
    else:
        ckpt.write_bytes(content)
    key = {"eval": "ckpt_path", "predict": "stage1.ckpt_path", "pointr": "stage1.ckpt_path"}[command]
    extra = {"eval": [], "predict": ["table=t.json", "question=q"], "pointr": ["stage2.ckpt_path=null"]}[command]
    line = one_error_line(mate([command, f"{key}={ckpt}", *extra], tmp_path))
    assert str(ckpt) in line and "checkpoint" in line


def test_a_validation_interval_longer_than_an_epoch_is_one_line_and_its_fix_works(tmp_path):
    args = ["train", "experiment=hybridqa_mate", "trainer.val_check_interval=50", "trainer.max_steps=2", "logger=csv"]
    proc = mate(args, tmp_path / "a")  # after preprocessing: library warnings may precede the line
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("mate:")]
    assert "trainer.val_check_interval=50" in line and "training batches of one epoch" in line, line
    assert "trainer.check_val_every_n_epoch=null" in line
    fixed = mate([*args, "trainer.check_val_every_n_epoch=null"], tmp_path / "b")
    assert fixed.returncode == 0, fixed.stderr[-2000:]


# ------------------------------------------------------------------ checked before anything loads
def nothing_touched(tmp: Path) -> bool:
    """No run dir (outputs), no cache: the check ran before Hydra's app and any data."""
    return not (tmp / "outputs").exists() and not (tmp / "cache").exists()


@pytest.mark.parametrize(
    "args, names",
    [
        (["train", "experiment=hybridqa_mate", "dataset.max_length=abc"], ["dataset.max_length=abc", "int"]),
        (["train", "model.optimizer.lr=fast"], ["model.optimizer.lr=fast", "float"]),
        (["train", "--cfg", "job", "model.optimizer.lr=fast"], ["model.optimizer.lr=fast", "float"]),
        (["train", "trainer.max_steps=three"], ["trainer.max_steps=three", "int"]),
        (["train", "dataset.max_lenght=512"], ["dataset.max_lenght", "did you mean dataset.max_length"]),
        (["train", "atention=mate"], ["atention", "did you mean attention"]),
        (["train", "-m", "attention=mate,dense", "seed=1,two"], ["seed=two", "int"]),
        (["pretrain", "dataset.mask_seed=x"], ["dataset.mask_seed=x", "int"]),
        (["train", "+debug=overfit"], ["+debug=overfit", "debug=overfit (no +)"]),  # was accepted and ignored
        (["train", "+tags=[dev]"], ["+tags=[dev]", "tags=<value> (no +)"]),
        (["train", "tags=dev"], ["tags=dev", "list"]),
        (["eval", "ckpt_path=x", "overrides=[dataset.root=/data]"], ["overrides=['dataset.root=/data']"]),
    ],
)
def test_a_wrong_type_or_unknown_key_is_refused_before_anything_is_touched(tmp_path, args, names):
    line = one_error_line(mate(args, tmp_path))
    assert all(name in line for name in names), line
    assert nothing_touched(tmp_path)


@pytest.mark.parametrize("command", ["eval", "pointr"])
def test_an_unknown_key_in_a_runs_overrides_is_refused_before_anything_is_touched(tmp_path, command):
    """``overrides=[...]`` patch a trained run's config: their keys are that config's."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")  # never read: the check comes first
    (run / "resolved_config.yaml").write_text("dataset:\n  eval_batch_size: 8\n  max_length: 512\nseed: 1\n")
    ckpt = run / "checkpoints" / "last.ckpt"
    prefix = {"eval": "", "pointr": "stage1."}[command]
    extra = {"eval": [f"ckpt_path={ckpt}"], "pointr": [f"stage1.ckpt_path={ckpt}", "stage2.ckpt_path=null"]}[command]
    line = one_error_line(mate([command, *extra, f"{prefix}overrides=['dataset.max_lenght=128']"], tmp_path))
    assert f"{prefix}overrides" in line and "did you mean dataset.max_length" in line, line
    line = one_error_line(mate([command, *extra, f"{prefix}overrides=['dataset.eval_batch_size=two']"], tmp_path))
    assert "dataset.eval_batch_size=two" in line and "int" in line, line
    assert nothing_touched(tmp_path)
