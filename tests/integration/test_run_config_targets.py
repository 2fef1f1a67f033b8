"""A run dir is data, not a program: rebuilding a run (`mate eval`, `mate predict`,
`mate pointr`) refuses a `resolved_config.yaml` whose `_target_` mate_cli's configs never
name, in one line and before any target is called. The crafted run dir's payload writes a
marker file; with `trust_run_config=true` it does run, which shows the payload is real and
that the check is what stops it."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mate_cli.errors import MateError
from mate_cli.config.run_targets import allowed_targets, checked_run_config
from tests.helpers import ALIAS_BOMB
from tests.inprocess import run_captured, run_command

SAMPLE = Path(__file__).resolve().parents[2] / "data"
MODULES = {
    "table": "mate_cli.lit_modules.table_qa.TableQAModule",
    "cells": "mate_cli.lit_modules.cell_selection.CellSelectionModule",
    "span": "mate_cli.lit_modules.span.SpanModule",
}


class Payload:
    """Unpickled, it creates ``path``: any code could stand there."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def crafted_run(root: Path, module: str, marker: Path) -> Path:
    """A run dir whose model is the expected class, with a payload in a nested argument
    (Hydra builds nested targets first): `torch.load` of a pickle beside it, weights_only
    false, which Hydra's own target policy lets through. Returns its checkpoint."""
    root.mkdir(parents=True)
    torch.save(Payload(marker), root / "notes.pt")
    payload = {"_target_": "torch.load", "f": str(root / "notes.pt"), "weights_only": False}
    config = {
        "task_name": "train", "seed": 1,
        "dataset": {"_target_": "mate_cli.data.table_tasks.TableTaskDataModule", "task": "sqa",
                    "pretrained": "minilm", "extra": payload},
        "model": {"_target_": MODULES[module], "encoder": payload},
    }  # fmt: skip
    (root / "checkpoints").mkdir()
    OmegaConf.save(OmegaConf.create(config), root / "resolved_config.yaml")
    ckpt = root / "checkpoints" / "last.ckpt"
    torch.save({"state_dict": {}}, ckpt)
    return ckpt


def mate(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    """`mate <args>`: the command's own function on a config Hydra composes, in this process."""
    return run_captured(args[0], args[1:], tmp / "out")


def commands(tmp: Path, marker: Path) -> dict[str, list[str]]:
    table = crafted_run(tmp / "table_run", "table", marker)
    cells = crafted_run(tmp / "cells_run", "cells", marker)
    span = crafted_run(tmp / "span_run", "span", marker)
    sqa_table = next((SAMPLE / "sqa_sample" / "table_csv").glob("*.csv"))
    hybrid_table = next((SAMPLE / "hybridqa_sample" / "WikiTables-WithLinks" / "tables_tok").glob("*.json"))
    return {
        "eval": ["eval", f"ckpt_path={table}"],
        "predict": ["predict", f"ckpt_path={table}", f"table={sqa_table}", "question=who?"],
        "predict-pointr": [
            "predict",
            f"stage1.ckpt_path={cells}",
            f"stage2.ckpt_path={span}",
            f"table={hybrid_table}",
            "question=who?",
        ],  # fmt: skip
        "pointr": ["pointr", f"stage1.ckpt_path={cells}", f"stage2.ckpt_path={span}"],
    }


@pytest.mark.parametrize("command", ["eval", "predict", "predict-pointr", "pointr"])
def test_a_crafted_run_config_is_refused_in_one_line_before_any_target_is_called(tmp_path, command):
    marker = tmp_path / "payload_ran"
    proc = mate(commands(tmp_path, marker)[command], tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mate: error: "), proc.stderr[-2000:]
    assert "resolved_config.yaml" in lines[0] and "_target_='torch.load'" in lines[0], lines[0]
    assert "trust_run_config=true" in lines[0]
    assert not marker.exists()


def test_trusting_the_run_config_runs_what_it_names(tmp_path):
    marker = tmp_path / "payload_ran"
    with pytest.raises(Exception) as failed:  # the crafted model cannot be built, but its payload ran first
        mate([*commands(tmp_path, marker)["eval"], "trust_run_config=true"], tmp_path)
    assert marker.exists(), failed.value
    assert "trust_run_config=true: building" in (tmp_path / "out" / "eval.log").read_text()


# ------------------------------------------------------------------ the check itself
#: run configs `mate train experiment=hybridqa_mate` resolved at earlier commits (their paths moved to a home folder),
#: each beside every `_target_` conf/ named then: 5702f2f, and dcaabac, the last before callbacks, the trainer glue and
#: MATE's modules moved into packages of their own
WRITTEN_AT = {commit: Path(__file__).parent / f"run_{commit}" for commit in ("5702f2f", "dcaabac")}


@pytest.mark.parametrize("commit", sorted(WRITTEN_AT))
def test_a_run_config_written_at_an_earlier_commit_is_allowed_and_every_target_it_or_its_conf_named_resolves(commit):
    from hydra.utils import get_object

    from mate_cli.config.run_targets import RENAMED_TARGETS, walk_targets
    from mate_cli.config.yaml_data import read_run_config

    config = WRITTEN_AT[commit] / "resolved_config.yaml"
    recorded = [value for _, value in walk_targets(OmegaConf.to_container(OmegaConf.load(config)))]
    built = OmegaConf.to_container(checked_run_config(read_run_config(config, ""), config))
    targets = [value for _, value in walk_targets(built)]
    assert len(targets) == 15 and targets == [RENAMED_TARGETS.get(target, target) for target in recorded]
    assert set(recorded) - set(targets) and "mate_cli.trainer.wandb_logger.WandbLogger" in targets  # read renamed
    then = (WRITTEN_AT[commit] / "conf_targets.txt").read_text(encoding="utf-8").split()
    assert len(then) == 29
    for target in [*targets, *(RENAMED_TARGETS.get(t, t) for t in then)]:
        assert target in allowed_targets(), target
        get_object(target)  # imports


def test_each_renamed_target_is_read_under_a_current_name():
    from mate_cli.config.run_targets import RENAMED_TARGETS

    assert set(RENAMED_TARGETS.values()) <= allowed_targets()
    assert not set(RENAMED_TARGETS) & set(RENAMED_TARGETS.values())  # one step: no name renamed twice


def test_a_run_dir_trained_at_5702f2f_still_evaluates(trained, tmp_path):
    """A run dir whose ``resolved_config.yaml`` was written at 5702f2f, whose scheduler, progress log, throughput
    callback and W&B logger have moved since, and which holds the weights of its architecture: `mate eval` rebuilds and
    scores it, and its override check reads the old config too."""
    import shutil

    from tests.shared_runs import copy_run

    run = copy_run(
        trained("pointr_stage1"), tmp_path / "run"
    )  # MiniLM's cell selection: MATE has no weights of its own
    shutil.copy(WRITTEN_AT["5702f2f"] / "resolved_config.yaml", run / "resolved_config.yaml")
    overrides = f"overrides=['dataset.root={SAMPLE / 'hybridqa_sample'}','dataset.max_length=128']"
    metrics = run_command("eval", [f"ckpt_path={run}", overrides], tmp_path / "eval")
    assert 0 <= metrics["val/hits@1"] <= 1 and metrics["ckpt_step"] == 2 and metrics["data/validation/questions"] > 0
    from mate_cli.run.rebuild import load_run_config

    assert (
        load_run_config(run / "checkpoints" / "last.ckpt").model.scheduler._target_
        == "mate_cli.trainer.optim.linear_warmup"
    )


def test_the_allowed_targets_are_what_the_shipped_configs_name():
    allowed = allowed_targets()
    assert {"torch.optim.AdamW", "lightning.pytorch.callbacks.ModelCheckpoint", *MODULES.values(),
            "mate_cli.modeling.encoder.TableEncoder.from_pretrained"} <= allowed  # fmt: skip
    assert "builtins.exec" not in allowed and "torch.load" not in allowed
    assert all(target.startswith(("mate_cli.", "torch.", "lightning.")) for target in allowed), sorted(allowed)


def test_a_run_config_of_shipped_targets_is_built_from_its_resolved_copy(tmp_path):
    cfg = OmegaConf.create({"a": 3, "model": {"_target_": MODULES["table"], "lr": "${a}"},
                            "opts": [{"_target_": "torch.optim.AdamW"}]})  # fmt: skip
    out = checked_run_config(cfg, tmp_path / "resolved_config.yaml")
    assert OmegaConf.to_container(out, resolve=False) == {"a": 3, "model": {"_target_": MODULES["table"], "lr": 3},
                                                         "opts": [{"_target_": "torch.optim.AdamW"}]}  # fmt: skip


@pytest.mark.parametrize(
    "cfg, named",
    [
        ({"opts": [{"_target_": "os.system", "_args_": ["true"]}]}, "opts[0]._target_='os.system'"),
        ({"m": {"_target_": "torch.load", "weights_only": False}}, "m._target_='torch.load'"),
        ({"m": {"_target_": 3}}, "m._target_=3"),
        ({"m": {"_target_": {"x": "os.system"}}}, "m._target_={'x': 'os.system'}"),
        # an escaped interpolation resolves to one, which building would resolve again
        ({"m": {"x": "\\${oc.create:'{_target_: os.system}'}"}}, 'm.x="${oc.create'),
        ({"m": {"_target_": "${oc.env:MATE_NOT_SET}"}}, "does not resolve"),
    ],
)
def test_what_the_check_refuses(tmp_path, cfg, named):
    with pytest.raises(MateError, match="resolved_config.yaml") as err:
        checked_run_config(OmegaConf.create(cfg), tmp_path / "resolved_config.yaml")
    assert named in str(err.value) and "\n" not in str(err.value)


def test_trust_builds_the_config_as_it_is_with_a_warning(tmp_path, caplog):
    cfg = OmegaConf.create({"m": {"_target_": "os.system"}, "n": {"_target_": "os.getcwd"}})
    with caplog.at_level(logging.WARNING):
        assert checked_run_config(cfg, tmp_path / "c.yaml", trust=True) is cfg
    assert "m._target_='os.system'" in caplog.text and "(and 1 more)" in caplog.text


# ------------------------------------------------------------------ the file itself: data with limits
# ten levels of ten aliases each: 10**10 strings once expanded, under 500 bytes on disk
def tiny_run(root: Path, text: str) -> Path:
    """A run dir holding ``text`` as its config and a checkpoint that passes the file check."""
    (root / "checkpoints").mkdir(parents=True)
    (root / "resolved_config.yaml").write_text(text)
    torch.save({"state_dict": {}}, root / "checkpoints" / "last.ckpt")
    return root / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    "text, named",
    [
        (ALIAS_BOMB, "resolved_config.yaml:1:4: an anchor or alias"),
        ("model: !!python/object:os.system {}\n", "resolved_config.yaml:1:8: the tag !!python/object:os.system"),
        ("model: !!binary aGk=\n", "the tag !!binary"),
        ("model: !mine 3\n", "the tag !mine"),
        ("model: " + "[" * 100 + "]" * 100 + "\n", "nested more than 64 deep"),
        ("model: [1, 2\nseed: 3\n", "resolved_config.yaml:2:5: expected ',' or ']'"),
        ("seed: 1\nseed: 2\n", "found duplicate key seed"),
        ("home: ${oc.env:MATE_TEST_MARKER}\n", "home holds an interpolation"),
        ("m:\n  - {x: '${run_config_probe:}'}\n", "m[0].x holds an interpolation"),
        ("- 1\n", "holds a YAML list, not a mapping of config keys"),
        ("", "holds nothing, not a mapping of config keys"),
    ],
    ids=[
        "alias bomb",
        "python tag",
        "binary tag",
        "local tag",
        "deep",
        "malformed",
        "duplicate key",
        "env",
        "resolver",
        "list",
        "empty",
    ],
)
def test_a_run_config_file_is_read_as_data_with_limits(tmp_path, monkeypatch, text, named):
    from mate_cli.run.rebuild import load_run_config

    calls = []
    OmegaConf.register_new_resolver("run_config_probe", lambda: calls.append(1) or "x", replace=True)
    monkeypatch.setenv("MATE_TEST_MARKER", "resolved-marker")
    with pytest.raises(MateError) as err:
        load_run_config(tiny_run(tmp_path.resolve(), text))
    message = str(err.value)
    assert message.startswith(str(tmp_path.resolve() / "resolved_config.yaml")) and named in message, message
    assert "pass a checkpoint whose run dir `mate train` wrote" in message
    assert "\n" not in message and "resolved-marker" not in message and not calls


def test_a_run_config_file_holds_what_omegaconf_reads_from_it(tmp_path):
    from mate_cli.config.yaml_data import read_yaml

    path = tmp_path / "resolved_config.yaml"
    path.write_text("lr: 1e-3\nday: 2024-01-01\nname: '3'\nx: ${lr}\n")
    assert read_yaml(path, "", interpolations=True) == OmegaConf.to_container(OmegaConf.load(path)) == {
        "lr": 1e-3, "day": "2024-01-01", "name": "3", "x": "${lr}"}  # fmt: skip


def test_an_oversized_run_config_is_refused_before_it_is_read(tmp_path):
    from mate_cli.config.yaml_data import MAX_BYTES, read_yaml

    path = tmp_path / "resolved_config.yaml"
    with open(path, "wb") as handle:
        handle.truncate(MAX_BYTES * 100)  # sparse: nothing to read, only a size
    with pytest.raises(MateError, match=r"is 100,000,000 bytes, more than a run config's 1,000,000"):
        read_yaml(path, "the fix")


def test_trust_lifts_the_interpolation_refusal_but_never_the_file_limits(tmp_path):
    from mate_cli.run.rebuild import load_run_config

    text = f"a: 3\nmodel: {{_target_: {MODULES['table']}, lr: '${{a}}'}}\n"
    with pytest.raises(MateError, match="model.lr holds an interpolation.*pass trust_run_config=true"):
        load_run_config(tiny_run(tmp_path / "interpolated", text))
    assert load_run_config(tiny_run(tmp_path / "trusted", text), trust=True).model.lr == 3
    with pytest.raises(MateError, match="an anchor or alias"):
        load_run_config(tiny_run(tmp_path / "bomb", ALIAS_BOMB), trust=True)


def test_report_and_the_override_check_pass_over_an_alias_bomb_at_once(tmp_path):
    """`mate report` lists the run as failed; the check of ``overrides`` leaves the file to the command."""
    from mate_cli.config.check import check_run_patches
    from mate_cli.report.collect import load_run

    ckpt = tiny_run(tmp_path / "run", ALIAS_BOMB)
    run = load_run(tmp_path / "run", tmp_path)
    assert run.status == "failed" and "an anchor or alias" in run.error, run.error
    assert check_run_patches({"ckpt_path": str(ckpt), "overrides": ["seed=2"]}) is None


def test_mate_eval_of_an_alias_bomb_is_one_line_at_once(tmp_path):
    tiny_run(tmp_path / "run", ALIAS_BOMB)
    proc = mate(["eval", f"ckpt_path={tmp_path / 'run'}"], tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "an anchor or alias" in lines[0], proc.stderr[-2000:]


def test_a_run_dir_from_another_machine_caches_under_this_commands_cache_dir(tmp_path):
    """Its recorded ``paths.cache_dir`` is missing here: eval and PointR preprocess under this command's cache,
    not into a path they would create; on the run's own machine (the folder exists) its cache is reused."""
    from mate_cli.run.rebuild import dataset_here, load_run_config

    elsewhere = tmp_path / "other_machine" / "cache"
    text = f"paths: {{cache_dir: {elsewhere}}}\ndataset: {{cache_dir: {elsewhere}/tabfact, task: tabfact}}\n"
    cfg = load_run_config(tiny_run(tmp_path / "run", text))
    assert dataset_here(cfg, str(tmp_path / "here")).cache_dir == str(tmp_path / "here" / "tabfact")
    elsewhere.mkdir(parents=True)  # the run's machine: its cache stays
    cfg = load_run_config(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert dataset_here(cfg, str(tmp_path / "here")).cache_dir == f"{elsewhere}/tabfact"
    cfg = load_run_config(tmp_path / "run" / "checkpoints" / "last.ckpt", [f"dataset.cache_dir={tmp_path}/mine"])
    elsewhere.rmdir()  # an override elsewhere is kept
    assert dataset_here(cfg, str(tmp_path / "here")).cache_dir == f"{tmp_path}/mine"
    assert not (tmp_path / "here").exists() and not elsewhere.exists()


def test_a_rebuilt_run_does_not_compile_unless_its_overrides_say_so(tmp_path):
    """``model.encoder.compile`` says how training ran, not what the weights compute: eval, predict and PointR rebuild
    the run without it (a machine without a compiler still evaluates it), unless ``overrides=`` sets it."""
    from mate_cli.run.rebuild import load_run_config

    text = "seed: 1\nmodel:\n  encoder:\n    compile: true\n    compile_mode: reduce-overhead\n"
    ckpt = tiny_run(tmp_path.resolve(), text)
    rebuilt = load_run_config(ckpt)
    assert rebuilt.model.encoder.compile is False and rebuilt.model.encoder.compile_mode is None
    asked = load_run_config(ckpt, ["model.encoder.compile=true"])
    assert asked.model.encoder.compile is True


def test_a_run_from_before_the_other_decoding_is_rebuilt_with_tapas_and_may_be_scored_with_it(tmp_path):
    """``model.head.at_least_one_cell`` came after runs were trained: their configs lack it. Rebuilt, such a run decodes
    as it was validated (TAPAS: the cells above 0.5), and an override may still ask for the other decoding."""
    from mate_cli.config.check import check_run_patches
    from mate_cli.run.rebuild import load_run_config

    text = f"seed: 1\nmodel:\n  _target_: {MODULES['table']}\n  task: sqa\n  head:\n    temperature: 1.0\n"
    ckpt = tiny_run(tmp_path.resolve(), text)
    assert load_run_config(ckpt).model.head.at_least_one_cell is False
    asked = ["model.head.at_least_one_cell=true"]
    check_run_patches({"ckpt_path": str(ckpt), "overrides": asked})  # `mate eval`'s check of its command line
    rebuilt = load_run_config(ckpt, asked)
    assert rebuilt.model.head.at_least_one_cell is True and rebuilt.model.head.temperature == 1.0
    misspelt = ["model.head.at_least_one_cel=true"]  # still refused, by both
    with pytest.raises(MateError, match="model.head.at_least_one_cel=true"):
        check_run_patches({"ckpt_path": str(ckpt), "overrides": misspelt})
    with pytest.raises(MateError, match="model.head.at_least_one_cel=true"):
        load_run_config(ckpt, misspelt)


def test_each_recorded_option_is_an_argument_of_its_target():
    """The table of options added since runs were trained names real targets and their real arguments (a renamed class
    or argument would leave old runs rebuilt without the value their function had)."""
    import inspect

    from hydra.utils import get_object

    from mate_cli.config.recorded import RECORDED_BEFORE

    for target, options in RECORDED_BEFORE.items():
        parameters = inspect.signature(get_object(target)).parameters
        for key in options:
            assert key.split(".")[0] in parameters, (target, key)
