"""The config schema against the shipped configs: every key of every option of every
group has a type, every shipped value fits it, and the command-line check refuses
wrong types and unknown keys with the closest key, in process (Hydra's compose API)."""

from __future__ import annotations

import re
import shlex
from functools import lru_cache
from typing import Any, Literal, Optional, Union, get_args

import pytest
from omegaconf import OmegaConf

from mate_cli.config.check import check_command_line, check_dotlist
from mate_cli.config.schema import DECLARED, UNTYPED, dotted_keys, key_type, lookup, trainer_parameters
from mate_cli.config.schema import trainer_argument, type_problem
from mate_cli.errors import MateError
from mate_cli.paths import CONF_DIR, REPO_ROOT
from tests.inprocess import hydra_compose

#: commands with config groups to choose from, and the groups each option of which is composed
GROUPED = {
    "train": ("experiment", "attention", "dataset", "model", "hardware", "logger", "debug", "profile", "ambiguity"),
    "pretrain": ("attention", "dataset", "hardware", "profile", "debug"),
}
SINGLE = ("eval", "pointr", "predict", "bench", "baseline", "report", "synthesize")


@lru_cache(maxsize=1)
def every_composed_config() -> list[tuple[str, str, dict]]:
    """``(command, override, plain config)`` for each command and each option of its groups."""
    out = []
    with hydra_compose() as compose:
        for command in SINGLE:
            out.append((command, "", OmegaConf.to_container(compose(command), resolve=False)))
        for command, groups in GROUPED.items():
            for group in groups:
                for option in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
                    try:
                        cfg = compose(command, overrides=[f"{group}={option}"])
                    except Exception:  # noqa: BLE001 - an option of another command (pretrain's datasets)
                        continue
                    out.append((command, f"{group}={option}", OmegaConf.to_container(cfg, resolve=False)))
    return out


def typed_keys(command: str, tree: dict):
    for key in dotted_keys(tree):
        if key.startswith("hydra") or key.rsplit(".", 1)[-1].startswith("_"):
            continue
        yield key, lookup(tree, key), key_type(tree, key, command)


def test_enough_configs_are_composed():
    """Over 20 s the first time: every option of every config group is composed once, for this module's tests."""
    commands = {command for command, _, _ in every_composed_config()}
    assert commands == set(SINGLE) | set(GROUPED) and len(every_composed_config()) > 60


def test_every_key_of_every_option_has_a_type():
    untyped = sorted(
        {
            f"{key} ({command} {override})"
            for command, override, tree in every_composed_config()
            for key, default, expected in typed_keys(command, tree)
            # a Lightning Trainer argument is typed as Lightning annotates it (Any where the reader cannot read it)
            if expected is UNTYPED and trainer_argument(command, key) not in trainer_parameters()
        }
    )
    assert not untyped, f"declare these in mate_cli/config/schema.py DECLARED: {untyped}"


def test_every_shipped_value_fits_its_type():
    wrong = []
    for command, override, tree in every_composed_config():
        for key, default, expected in typed_keys(command, tree):
            if default == "???":
                continue
            problem = type_problem(key, default, expected)
            if problem:
                wrong.append(f"{command} {override}: {problem}")
    assert not wrong, wrong


def test_every_declared_key_exists_somewhere():
    keys = {key for _, _, tree in every_composed_config() for key in dotted_keys(tree)}
    assert set(DECLARED) - keys == set()


def test_the_parameter_types_table_is_what_make_parameter_types_writes():
    """The table the check reads is the real signatures': mate_cli's targets always, and the whole text (Lightning's
    Trainer, torch's optimiser) where the installed Lightning and torch are the ones it was written from."""
    import lightning
    import torch

    from mate_cli.config import signatures
    from mate_cli.config.parameter_types import LIGHTNING, PARAMETER_TYPES, TORCH

    live = signatures.table()
    ours = [target for target in live if target.startswith("mate_cli.")]
    assert len(ours) > 20 and len(live["lightning.pytorch.trainer.trainer.Trainer"]) > 40
    stale = "mate_cli/config/parameter_types.py is stale: run `make parameter-types`"
    assert {t: PARAMETER_TYPES.get(t) for t in ours} == {t: live[t] for t in ours}, stale
    if (lightning.__version__, torch.__version__) == (LIGHTNING, TORCH):
        assert signatures.TABLE.read_text(encoding="utf-8") == signatures.render(live), stale


@pytest.mark.parametrize(
    "annotation, form",
    [
        ("Optional[int]", Optional[int]),
        ("int | str | None", Union[int, str, None]),
        ("Union[Literal['a', 'b'], None]", Optional[Literal["a", "b"]]),
        ("Sequence[int]", list),
        ("Mapping[str, Path]", dict),
        ("Union[str, Path]", Any),  # a class the check has no form for says nothing, so neither does the union
        ("Path", Any),
        ("Tuple[int, int]", tuple),
    ],
)
def test_an_annotation_becomes_what_the_check_understands(annotation, form):
    from pathlib import Path  # noqa: F401 - named by the annotations
    from typing import Mapping, Sequence, Tuple  # noqa: F401

    from mate_cli.config.signatures import simplify, source

    simple = simplify(eval(annotation))
    assert simple == form and eval(source(simple)) == form


def test_the_table_s_text_does_not_depend_on_which_equal_union_was_made_first():
    from mate_cli.config.signatures import source

    first = Optional[Union[tuple, dict]]
    second = Optional[Union[dict, tuple]]  # equal to the first: typing's cache hands back the first, tuple first
    assert get_args(second) == (tuple, dict, type(None))  # what made the table's text depend on import order
    assert source(first) == source(second) == "Union[dict, tuple, None]"
    assert source(Literal["zero", "normal"]) == "Literal['normal', 'zero']"


def test_a_trainer_argument_of_another_lightning_is_left_to_lightning(monkeypatch):
    from mate_cli.config import schema

    assert "trainer.max_stepz is not a Lightning Trainer argument" in schema.trainer_problem("max_stepz")
    monkeypatch.setattr(schema, "LIGHTNING", "0.0.1")  # the table was written from another Lightning
    assert schema.trainer_problem("max_stepz") is None
    assert "has the wrong type" in schema.trainer_problem("max_steps", "three")


# ------------------------------------------------------------------ the command-line check
@pytest.mark.parametrize(
    "command, args, names",
    [
        ("train", ["dataset.max_length=abc"], ["dataset.max_length=abc", "int", "512"]),
        ("train", ["model.optimizer.lr=fast"], ["model.optimizer.lr=fast", "float"]),
        ("train", ["trainer.max_steps=three"], ["trainer.max_steps=three", "int"]),
        ("train", ["dataset.max_lenght=512"], ["dataset.max_lenght", "did you mean dataset.max_length"]),
        ("train", ["atention=mate"], ["atention", "did you mean attention"]),
        ("train", ["trainer.max_stepz=3"], ["trainer.max_stepz", "trainer.max_steps"]),
        ("train", ["experiment=sqa_mate", "dataset.long_table_tokens=1.5"], ["dataset.long_table_tokens=1.5", "int"]),
        ("train", ["dataset.num_workers=lots"], ["dataset.num_workers=lots", "'auto'"]),
        ("train", ["model.encoder.new_type_embeddings=zeros"], ["new_type_embeddings=zeros", "'normal' | 'zero'"]),
        ("train", ["-m", "seed=1,2,x"], ["seed=x", "int"]),
        ("train", ["-m", "attention=mate,dense", "attention.variant=exact"], ["attention=dense", "attention.variant"]),
        ("train", ["+seed=3"], ["seed is already set"]),
        ("train", ["~nope"], ["nope"]),
        ("train", ["model.encoder=5"], ["model.encoder is a config group", "model/encoder="]),
        ("train", ["callbacks.lr_monitor=5"], ["callbacks.lr_monitor=5", "dict"]),
        ("train", ["dataset.split=files"], ["dataset/split=<by_table|files>"]),
        ("train", ["'a=[1,2'"], ["cannot parse"]),
        ("pretrain", ["dataset.mask_seed=x"], ["dataset.mask_seed=x", "int"]),
        ("bench", ["bench.threads=all"], ["bench.threads=all", "int | None"]),
        ("train", ["run_name=2024"], ["run_name=2024", "takes str"]),  # W&B refuses a number for a run's name
        ("report", ["outputs", "plot=false"], ["plot", "did you mean plots"]),
        ("eval", ["attention=mate"], ["attention"]),
    ],
)
def test_wrong_types_and_unknown_keys_are_one_line_naming_the_key(command, args, names):
    args = [shlex.split(a)[0] for a in args]
    problem = check_command_line(command, args)
    assert problem is not None and "\n" not in problem
    assert all(name in problem for name in names), problem


@pytest.mark.parametrize(
    "command, args",
    [
        ("train", ["dataset.num_workers=2", "trainer.val_check_interval=0.5", "callbacks.best_checkpoint=null"]),
        ("train", ["-m", "attention=mate,dense,sat", "seed=1,2", "dataset.max_length=range(128,512,128)"]),
        ("train", ["experiment=sqa_mate", "dataset.long_table_tokens=null", "trainer.limit_val_batches=2"]),
        ("train", ["+trainer.limit_train_batches=3", "++model.new_key=1", "~callbacks.lr_monitor"]),
        ("train", ["hparams_search=optuna"]),
        ("train", ["--cfg", "job", "model.optimizer.lr=1e-4"]),
        ("pointr", ["stage1.ckpt_path=x", "stage2.ckpt_path=null"]),
        ("predict", ["question='What is 1,000?'", "table=x.csv", "ckpt_path=y"]),
        ("predict", ["question=1999", "table=x.csv", "ckpt_path=y"]),  # Hydra reads a number: a name or text takes it
        ("report", ["outputs", "plots=false", "tasks=[train,pretrain]"]),
        ("train", ["dataset/split=files"]),
        ("train", ["-m", "run_name='a b',c", 'experiment_name="it\'s",x']),  # quoted sweep items are strings
        ("train", ["-m", "paper_name='é','ü'", "ckpt_path=null"]),  # composed again at its first value, quoted
    ],
)
def test_valid_command_lines_pass(command, args):
    assert check_command_line(command, args) is None


def test_help_and_other_config_names_are_left_to_hydra():
    assert check_command_line("train", ["--help", "dataset.max_length=abc"]) is None
    assert check_command_line("train", ["-cn", "other", "dataset.max_length=abc"]) is None


#: the pages a user reads commands from: the README and the docs it links for the rest
USER_PAGES = ("README.md", "docs/runs.md", "docs/debugging.md", "docs/datasets.md", "docs/methods.md", "docs/speed.md")


def readme_commands() -> list[list[str]]:
    """Every ``mate <command> ...`` line of the README's and its pages' code blocks and tables
    (continuations joined, comments cut, ``<placeholders>`` filled with a name)."""
    pages = [(REPO_ROOT / page).read_text(encoding="utf-8") for page in USER_PAGES]
    text = "\n".join(pages).replace("\\\n", " ")
    found = re.findall(r"^(mate [a-z]+\b[^\n]*)", text, flags=re.M) + re.findall(r"\| `(mate [a-z]+\b[^`]*)` \|", text)
    commands = [shlex.split(re.sub(r"<[^>]+>", "x", re.split(r"\s#", line)[0])) for line in found]
    synopsis = ("…", "[_sample]")  # the command table's synopses: `mate predict table=… question=…`
    return [c for c in commands if "--help" not in c and not any(s in a for a in c for s in synopsis)]


def test_every_readme_command_passes_the_check():
    """Over 20 s: every command the README prints is composed and checked."""
    commands = readme_commands()
    assert len(commands) >= 20 and any(c[1] == "eval" for c in commands)
    for command in commands:
        assert check_command_line(command[1], command[2:]) is None, command


# ------------------------------------------------------------------ a trained run's dotlists
RUN = {
    "dataset": {
        "_target_": "mate_cli.data.table_tasks.TableTaskDataModule",
        "eval_batch_size": 8,
        "root": "/data",
        "limit_questions": None,
    },
    "seed": 1,
}


@pytest.mark.parametrize(
    "entry, names",
    [
        ("dataset.eval_batch_sise=2", ["dataset.eval_batch_sise", "did you mean dataset.eval_batch_size"]),
        ("dataset.eval_batch_size=two", ["dataset.eval_batch_size=two", "int"]),
        ("dataset.limit_questions=some", ["dataset.limit_questions=some", "int | None"]),
        ("seed", ["not key=value"]),
    ],
)
def test_a_run_dotlist_names_keys_of_that_run_with_values_of_their_type(entry, names, tmp_path):
    with pytest.raises(MateError) as err:
        check_dotlist(RUN, [entry], "stage1.overrides", tmp_path / "resolved_config.yaml")
    assert str(err.value).startswith("stage1.overrides: ") and all(n in str(err.value) for n in names), err.value


def test_a_run_dotlist_of_known_keys_passes(tmp_path):
    check_dotlist(
        RUN,
        ["dataset.eval_batch_size=2", "dataset.root=/other", "dataset.limit_questions=5"],
        "overrides",
        tmp_path / "resolved_config.yaml",
    )


def test_a_target_conf_does_not_name_leaves_its_keys_to_their_defaults():
    """A user's own `_target_` is not in the table: its keys take their defaults' types, no crash."""
    tree = {"model": {"_target_": "not_installed_pkg.Model", "width": 3}}
    assert key_type(tree, "model.width") is int


def _a_target(width: int, depth: "NamedOnlyForTypeCheckers", *layers, scale: float = 1.0, **more): ...  # noqa: F821


def test_a_signature_s_parameters_and_an_annotation_that_does_not_evaluate():
    from mate_cli.config.signatures import parameters_of

    assert parameters_of("tests.conf.test_schema._a_target") == {"width": int, "depth": Any, "scale": float}
    # a class passing **kwargs on takes its bases' arguments too, its own first
    assert {"quiet", "name", "save_dir", "offline"} <= set(parameters_of("mate_cli.trainer.wandb_logger.WandbLogger"))
