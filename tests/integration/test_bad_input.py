"""Bad input: one `mate: error:` line naming the key or file and the fix, exit status 2,
and nothing built or written before the check.

Checks of the command line run `mate`'s entry point (:func:`mate_cli.cli.main`) in this
process and must answer before Hydra's app starts; checks made inside a command run that
command's own function on a config Hydra composes (tests/inprocess.py). That `mate`
prints such a line and exits 2 as a process is tested once, in tests/integration/test_cli.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mate_cli.errors import MateError
from tests.inprocess import compose_command, main_before_hydra, run_command


@pytest.fixture
def mate(tmp_path, capsys, monkeypatch):
    """``mate(args)``: the one ``mate: error:`` line `mate <args>` answers with before Hydra's
    app starts (exit status 2), outputs and caches under ``tmp_path``."""
    monkeypatch.setenv("MATE_OUTPUT_DIR", str(tmp_path / "outputs"))
    monkeypatch.setenv("MATE_CACHE_DIR", str(tmp_path / "cache"))

    def one_error_line(args: list[str]) -> str:
        code, out, err = main_before_hydra(args, capsys, monkeypatch)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("mate: error: "), (code, out, err)
        return lines[0]

    return one_error_line


def task_error(command: str, args: list[str], run: Path) -> str:
    """The one line of the user error ``command``'s own function raises into ``run`` (`mate`
    prints it after ``mate: error:`` and exits 2)."""
    with pytest.raises(MateError) as err:
        run_command(command, args, run)
    assert "\n" not in str(err.value), str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    "override, names",
    [
        ("trainer.max_steps=abc", ["trainer.max_steps", "int"]),
        ("+trainer.max_stepz=3", ["trainer.max_stepz", "max_steps"]),
        ("trainer.max_stepz=3", ["trainer.max_stepz", "max_steps"]),
        ("+trainer.callbacks=[]", ["trainer.callbacks", "callbacks"]),
    ],
)
def test_bad_trainer_arguments_fail_before_anything_is_built(mate, tmp_path, override, names):
    line = mate(["train", "experiment=hybridqa_mate", override])
    assert all(name in line for name in names), line
    assert not (tmp_path / "cache").exists()  # no preprocessing happened


def test_any_trainer_argument_works_without_a_plus(tmp_path):
    """``trainer.limit_val_batches`` is no key of conf/trainer: the command line's rewrite
    lets Hydra add it (printing the composed config through `mate` is tested in test_cli)."""
    cfg = compose_command("train", ["trainer.limit_val_batches=2", "trainer.max_steps=5"], tmp_path, checked=True)
    assert cfg.trainer.limit_val_batches == 2 and cfg.trainer.max_steps == 5


def test_a_folder_named_with_a_line_break_is_refused_before_any_folder_is_made(mate, tmp_path):
    folder = tmp_path / "runs" / "a\nb"  # Hydra's lexer failed on it after mate had made and locked the folder
    line = mate(["train", f"hydra.run.dir={folder}"])
    assert line == (
        f"mate: error: hydra.run.dir holds a line break ({str(tmp_path / 'runs' / 'a')!r}...); "
        "name the folder on one line"
    )
    assert not (tmp_path / "runs").exists()


def test_an_unknown_experiment_is_one_line_with_the_options(mate):
    line = mate(["train", "experiment=nope"])
    assert "experiment=nope" in line and "hybridqa_mate" in line and "hybridqa_tapas" in line


def test_an_unknown_backend_in_a_sweep_is_caught_too(mate):
    line = mate(["train", "-m", "attention=mate,dnese"])
    assert "attention=dnese" in line and "dense" in line


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", "truncated"])
@pytest.mark.parametrize("command", ["eval", "predict", "pointr"])
def test_a_broken_checkpoint_is_named_before_data_and_model_are_built(tmp_path, monkeypatch, command, content):
    monkeypatch.setenv("MATE_CACHE_DIR", str(tmp_path / "cache"))
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
    line = task_error(command, [f"{key}={ckpt}", *extra], tmp_path / "out")
    assert str(ckpt) in line and "checkpoint" in line
    assert not (tmp_path / "cache").exists()  # named before any data was read


def test_a_cut_short_model_file_is_one_line_exit_2_and_failed(tmp_path, monkeypatch, minilm_dir):
    """A model directory (model.encoder.pretrained) whose model.safetensors an interrupted copy cut short: the app
    ends in one line naming the file, exit status 2 and ``FAILED`` (not Hydra's error block about its target)."""
    from tests.inprocess import run_app

    monkeypatch.setenv("MATE_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        (model / name).write_bytes((minilm_dir / name).read_bytes())
    with open(minilm_dir / "model.safetensors", "rb") as whole:
        (model / "model.safetensors").write_bytes(whole.read(1 << 20))
    run = tmp_path / "run"
    args = ["experiment=hybridqa_mate", "attention=dense", f"model.encoder.pretrained={model}", "logger=csv"]
    code, err = run_app("train", args, run)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("mate: error: "), err[-3000:]
    assert f"{model / 'model.safetensors'} is not a whole weight file" in lines[0] and "again" in lines[0]
    assert (run / "FAILED").read_text().strip() == lines[0]


def test_a_validation_interval_longer_than_an_epoch_is_one_line_and_its_fix_works(tmp_path):
    args = [
        "experiment=hybridqa_mate",
        "trainer.val_check_interval=50",
        "trainer.max_steps=2",
        "logger=csv",
        "validate_best=false",
        "dataset.max_length=128",
    ]
    line = task_error(
        "train", [*args, f"dataset.cache_dir={tmp_path / 'cache'}"], tmp_path / "a"
    )  # known once the data is read
    assert "trainer.val_check_interval=50" in line and "training batches of one epoch" in line, line
    assert "trainer.check_val_every_n_epoch=null" in line
    run_command(
        "train",
        [*args, "trainer.check_val_every_n_epoch=null", f"dataset.cache_dir={tmp_path / 'cache'}"],
        tmp_path / "b",
    )  # the fix it names: the run trains and finishes
    assert (tmp_path / "b" / "metrics.json").is_file() and (tmp_path / "b" / "checkpoints" / "last.ckpt").is_file()


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
        (["train", "profile_steps=-1"], ["profile_steps=-1 is below 0", "or null for no profile"]),  # was accepted
        (["train", "-m", "profile_steps=20,-5"], ["profile_steps=-5 is below 0"]),
    ],
)
def test_a_wrong_type_or_unknown_key_is_refused_before_anything_is_touched(mate, tmp_path, args, names):
    line = mate(args)
    assert all(name in line for name in names), line
    assert nothing_touched(tmp_path)


@pytest.mark.parametrize("command", ["eval", "pointr"])
def test_an_unknown_key_in_a_runs_overrides_is_refused_before_anything_is_touched(mate, tmp_path, command):
    """``overrides=[...]`` patch a trained run's config: their keys are that config's."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")  # never read: the check comes first
    (run / "resolved_config.yaml").write_text("dataset:\n  eval_batch_size: 8\n  max_length: 512\nseed: 1\n")
    ckpt = run / "checkpoints" / "last.ckpt"
    prefix = {"eval": "", "pointr": "stage1."}[command]
    extra = {"eval": [f"ckpt_path={ckpt}"], "pointr": [f"stage1.ckpt_path={ckpt}", "stage2.ckpt_path=null"]}[command]
    line = mate([command, *extra, f"{prefix}overrides=['dataset.max_lenght=128']"])
    assert f"{prefix}overrides" in line and "did you mean dataset.max_length" in line, line
    line = mate([command, *extra, f"{prefix}overrides=['dataset.eval_batch_size=two']"])
    assert "dataset.eval_batch_size=two" in line and "int" in line, line
    assert nothing_touched(tmp_path)
