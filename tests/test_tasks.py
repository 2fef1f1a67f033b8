"""The task registry (:mod:`mate_cli.tasks`): every command asks it, and a new task is one
registration. The toy task here is WikiTQ's lookups without aggregation: WikiTQ's reader
and text answers on SQA's head, a combination no bundled task has."""

from __future__ import annotations

import csv

import pytest
from hydra.utils import instantiate

from mate_cli import tasks
from mate_cli.run.job import find_mate_error
from mate_cli.errors import MateError
from tests.inprocess import compose_command, run_command

TOY = tasks.TableTask(
    "wtq_lookup",
    reader="mate_cli.data.wtq:WTQReader",
    table_file="mate_cli.data.wtq:read_table_file",
    answer="texts",
    baselines="mate_cli.pipelines.trivial:wtq_baselines",
    predictions="mate_cli.data.answer_files:write_wtq",
)


def test_an_unknown_task_or_a_head_of_another_kind_is_one_line(tmp_path):
    with pytest.raises(MateError) as err:
        tasks.get("hybridqa", "model.task")
    assert str(err.value) == "model.task='hybridqa' is not a table task; use one of sqa, tabfact, wtq"
    cfg = compose_command("train", ["experiment=sqa_mate", "model.task=tabfact"], tmp_path / "run")
    with pytest.raises(Exception) as err:  # Hydra wraps it; `mate` prints the MateError of the chain
        instantiate(cfg.model)
    assert str(find_mate_error(err.value)).startswith("model.task='tabfact' answers with a verdict, not cells;")
    with pytest.raises(ValueError, match="answer='spans'"):
        tasks.TableTask("x", reader="", table_file="", answer="spans", baselines="", predictions="")


@pytest.mark.parametrize("name", tasks.names())
def test_every_bundled_task_names_objects_that_exist(name):
    task = tasks.get(name)
    for ref in (task.reader, task.table_file, task.baselines, task.predictions):
        assert callable(tasks._load(ref)), ref


def test_a_fifth_task_is_one_registration(monkeypatch, tmp_path):
    monkeypatch.setitem(tasks._TASKS, TOY.name, TOY)
    data = ["dataset=wtq_sample", f"dataset.task={TOY.name}"]
    train = run_command(
        "train",
        [
            "experiment=sqa_mate",
            *data,
            f"model.task={TOY.name}",
            "dataset.max_length=128",
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
            "logger=csv",
            "validate_best=false",
        ],
        tmp_path / "train",
    )
    assert 0.0 <= train["val/accuracy"] <= 1.0 and "val/seq" not in train  # not a sequential task
    assert train["data/validation/questions_with_answer_cells"] > 0  # answer texts found in cells

    evaluated = run_command("eval", [f"ckpt_path={tmp_path / 'train'}"], tmp_path / "eval")
    with open(evaluated["predictions"], encoding="utf-8", newline="") as f:  # WikiTQ's answer format
        ids = [row[0] for row in csv.reader(f, delimiter="\t")]
    assert len(ids) == train["data/validation/questions"] and all(i.startswith("nt-") for i in ids)

    baseline = run_command("baseline", data, tmp_path / "baseline")
    assert baseline["rule"].startswith("always answer")
