"""SQA, WikiTQ and TabFact end to end (Table 4's tasks), each command's own function on a
config Hydra composes in process (tests/inprocess.py).

Each task's MATE experiment trains a few steps on its bundled sample (a shared run of the
session: tests/shared_runs.py); `mate eval` then scores that checkpoint on *another*
dataset root through an upstream split file named by ``dataset.eval_file`` and writes the
predictions in the upstream answer format; `mate predict` answers one question about one
table file. (The ``*_tapas`` experiments differ by ``attention=dense`` only; tests/conf
composes and instantiates them, and the slow test trains them.)
"""

from __future__ import annotations

import csv
import json
import shutil
import warnings
from pathlib import Path

import pytest

from mate_cli.errors import MateError
from tests.helpers import REPO_ROOT, a_table_and_question, mate_env, run_mate
from tests.inprocess import run_command
from tests.shared_runs import screen

TRAIN = ["trainer.max_steps=3", "trainer.log_every_n_steps=1", "dataset.max_length=256"]


def another_root(task: str, base: Path) -> tuple[Path, str, int]:
    """A copy of the task's sample whose upstream evaluation file holds part of its questions.

    Returns ``(root, eval file name, questions in it)``.
    """
    root = base / f"{task}_root"
    shutil.copytree(REPO_ROOT / "data" / f"{task}_sample", root)
    if task == "wtq":
        lines = (root / "data" / "training.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        (root / "data" / "pristine-unseen-tables.tsv").write_text("".join(lines[:21]), encoding="utf-8")
        return root, "pristine-unseen-tables.tsv", 20
    if task == "sqa":
        with open(root / "train.tsv", encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        keep = [r for r in rows if (r["id"], r["annotator"]) in {(x["id"], x["annotator"]) for x in rows[:8]}]
        with open(root / "test.tsv", "w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter="\t")
            writer.writeheader()
            writer.writerows(keep)
        return root, "test.tsv", len(keep)
    examples = json.loads((root / "tokenized_data" / "val_examples.json").read_text(encoding="utf-8"))
    chosen = dict(list(examples.items())[:4])
    (root / "tokenized_data" / "test_examples.json").write_text(json.dumps(chosen), encoding="utf-8")
    return root, "test_examples.json", sum(len(v[0]) for v in chosen.values())


@pytest.mark.parametrize("task", ["sqa", "wtq", "tabfact"])
def test_task_trains_evaluates_on_another_split_file_and_predicts(task, trained, tmp_path, capsys):
    run = trained(f"{task}_task")  # tests/shared_runs.py: 3 steps on the task's sample
    metrics = json.loads((run / "metrics.json").read_text())
    if task == "tabfact":
        last_validation_inside_fit_is_kept(run, metrics, screen(run).read_text(encoding="utf-8"))
    assert 0.0 <= metrics["val/accuracy"] <= 1.0
    assert metrics["perf/tokens_per_s"] > 0 and metrics["data/train/questions"] > 0
    assert "data/train/fit_without_truncation" in metrics
    if task != "tabfact":
        assert 0.0 <= metrics["data/train/answer_cells_kept"] <= 1.0
    if task != "tabfact":
        assert 0.0 <= metrics["val/cell_top1"] <= 1.0
        assert 0.0 <= metrics["val/accuracy_at_least_one_cell"] <= 1.0  # the other decoding of the same weights
    # how the weak supervision trained WikiTQ's one-number answers (tapas_heads: QAOutput.aggregate / answer_kept)
    supervision = ("train/numbers_in_table_as_selection", "train/answer_loss_cut")
    if task == "wtq":
        assert all(0.0 <= metrics[name] <= 1.0 for name in supervision), metrics
    else:
        assert not any(name in metrics for name in supervision)
    if task == "sqa":
        assert 0.0 <= metrics["val/seq"] <= metrics["val/accuracy"] or metrics["val/accuracy"] == 0.0
        assert all(0.0 <= metrics[f"val/accuracy_q{n}"] <= 1.0 for n in (1, 2, 3))
        assert all(0.0 <= metrics[f"val/accuracy_{size}_cell_answers"] <= 1.0 for size in ("single", "multi"))
    else:
        assert "val/accuracy_q1" not in metrics  # not a sequential task
        assert "val/accuracy_single_cell_answers" not in metrics  # WikiTQ's answers are texts, TabFact's verdicts
    root, eval_file, expected = another_root(task, tmp_path)
    if task == "wtq":  # the long-table slice: 4 of the sample's 6 validation questions are over 512 whole
        assert metrics["val/long_questions"] == 4 and 0.0 <= metrics["val/accuracy_long"] <= 1.0
        assert metrics["data/test/questions"] == expected and 0.0 <= metrics["test/accuracy"] <= 1.0

    ckpt = run / "checkpoints" / "last.ckpt"
    eval_run = tmp_path / "eval"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scores = run_command(
            "eval",
            [f"ckpt_path={ckpt}", f"overrides=['dataset.root={root}','dataset.eval_file={eval_file}']"],
            eval_run,
        )
    # Lightning's note that the training run's callbacks are missing does not apply to an evaluation
    assert not [w for w in caught if "callbacks used to create the checkpoint" in str(w.message)]
    assert json.loads((eval_run / "metrics.json").read_text()) == scores
    assert scores["data/validation/questions"] == expected
    assert 0.0 <= scores["val/accuracy"] <= 1.0
    predictions = Path(scores["predictions"])
    assert predictions.parent == eval_run
    if task == "tabfact":
        verdicts = json.loads(predictions.read_text())
        assert sum(len(v) for v in verdicts.values()) == expected
        assert {x for v in verdicts.values() for x in v} <= {0, 1}
    else:
        lines = predictions.read_text(encoding="utf-8").splitlines()
        assert len(lines) == expected + (task == "sqa")  # SQA's file has a header
        if task == "sqa":
            assert lines[0].split("\t") == ["id", "annotator", "position", "answer_coordinates"]
            assert all(0.0 <= scores[f"val/accuracy_q{n}"] <= 1.0 for n in (1, 2, 3))
            assert all(0.0 <= scores[f"val/accuracy_{size}_cell_answers"] <= 1.0 for size in ("single", "multi"))

    table, question = a_table_and_question(task)
    capsys.readouterr()
    run_command("predict", [f"ckpt_path={ckpt}", f"table={table}", f"question={question}"], tmp_path / "predict")
    shown = capsys.readouterr().out
    answer = json.loads((tmp_path / "predict" / "prediction.json").read_text())
    assert answer["task"] == task
    if task == "tabfact":
        assert answer["verdict"] in ("entailed", "refuted") and "verdict:" in shown
    else:
        assert isinstance(answer["cells"], list) and "selected cells" in shown
    if task == "wtq":
        assert answer["aggregation"] in ("NONE", "SUM", "AVERAGE", "COUNT") and "answer:" in shown
        with pytest.raises(
            MateError,
            match=r"pass the checkpoint of a run that trained CellSelectionModule "
            r"\(a table-task run: `mate predict ckpt_path=",
        ):
            run_command("predict", [f"stage1.ckpt_path={ckpt}", f"table={table}", f"question={question}"],
                        tmp_path / "predict-stage1")  # fmt: skip


def test_tabfact_eval_with_shuffled_tables_scores_the_same_statements_against_other_tables(trained, tmp_path, capsys):
    """`mate eval tables=shuffled`: the same statements, labels and predictions file keys as `tables=own`, read with
    other tables of the split; metrics.json says which. A run whose answers are cells is refused in one line."""
    run = trained("tabfact_task")
    scores = {}
    for tables in ("own", "shuffled"):
        capsys.readouterr()
        scores[tables] = run_command("eval", [f"ckpt_path={run}", f"tables={tables}"], tmp_path / tables)
        shown = capsys.readouterr().out
        assert ("each statement with another table" in shown) == (tables == "shuffled")
    own, shuffled = scores["own"], scores["shuffled"]
    assert "tables" not in own and shuffled["tables"] == "shuffled"
    assert own["data/validation/questions"] == shuffled["data/validation/questions"] == 47
    assert 0.0 <= shuffled["val/accuracy"] <= 1.0 and own["ckpt_sha256"] == shuffled["ckpt_sha256"]
    predicted = {t: json.loads(Path(scores[t]["predictions"]).read_text()) for t in scores}
    assert {k: len(v) for k, v in predicted["own"].items()} == {k: len(v) for k, v in predicted["shuffled"].items()}
    with pytest.raises(
        MateError,
        match=r"^tables=shuffled pairs each TabFact statement with another table; .* "
        r"dataset=sqa: evaluate it with tables=own$",
    ):
        run_command("eval", [f"ckpt_path={trained('sqa_task')}", "tables=shuffled"], tmp_path / "sqa")


@pytest.mark.slow
@pytest.mark.parametrize(
    "experiment", [f"{t}_{a}" for t in ("sqa", "wtq", "tabfact") for a in ("mate", "tapas")] + ["tabfact_dot"]
)
def test_every_table_experiment_trains(experiment, tmp_path):
    env = mate_env(tmp_path / "outputs", tmp_path / "cache", HOME=str(tmp_path / "home"))
    done = run_mate(["train", f"experiment={experiment}", *TRAIN], env)
    assert done.returncode == 0, done.stderr[-3000:]


def test_dot_trains_through_mate_train_named_in_the_papers_notation_with_its_npe_per_s(tmp_path):
    """wtq_dot (column selection, the QA heads) on the bundled sample, in process; tabfact_dot runs in the slow test
    above."""
    from omegaconf import OmegaConf

    from mate_cli.config.naming import dir_name

    run = tmp_path / "run"
    metrics = run_command(
        "train",
        [
            "experiment=wtq_dot",
            "trainer.max_steps=1",
            "dataset.limit_questions=4",
            "dataset.max_length=512",
            "model.dot.top_k=128",
            "logger=csv",
            "validate_best=false",
            f"dataset.cache_dir={tmp_path / 'cache'}",
        ],
        run,
    )
    run_name = dir_name(OmegaConf.load(run / "resolved_config.yaml").run_name)  # the run dir's name, less time and tag
    assert run_name.startswith("wtq_dot-CC-512_C-DoT_minilm-128-minilm-"), (
        run_name
    )  # 512 and 128 keep the default run short
    assert metrics["perf/examples_per_s"] > 0  # the paper's NPE/s
    assert metrics["data/train/tokens_pruned"] > 0  # CC did cut to 1024 before DoT


def test_a_saved_tapas_wtq_checkpoint_evaluates_through_mate(tmp_path):
    """A ``TapasForQuestionAnswering`` directory (as a published WTQ checkpoint is) loads with
    its head and settings, and `mate train ... trainer.max_steps=0` validates it unchanged."""
    transformers = pytest.importorskip("transformers")
    import torch

    from mate_cli.pretrained import bundled_model_dir

    checkpoint = tmp_path / "tapas_wtq"
    config = transformers.TapasConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_aggregation_labels=4,
        use_answer_as_supervision=True,
        answer_loss_cutoff=0.664694,
        cell_selection_preference=0.207951,
        huber_loss_delta=0.121194,
        temperature=0.0352513,
    )
    torch.manual_seed(0)
    transformers.TapasForQuestionAnswering(config).save_pretrained(checkpoint)
    shutil.copy(bundled_model_dir() / "vocab.txt", checkpoint)
    run = tmp_path / "run"
    run_command(
        "train",
        [
            "experiment=wtq_tapas",
            f"model.encoder.pretrained={checkpoint}",
            "trainer.max_steps=0",
            f"dataset.cache_dir={tmp_path / 'cache'}",
        ],
        run,
    )
    log = (run / "train.log").read_text(encoding="utf-8")
    assert "(task head): 6 tensors; missing (freshly initialised): none" in log
    assert 0.0 <= json.loads((run / "metrics.json").read_text())["val/accuracy"] <= 1.0


def last_validation_inside_fit_is_kept(run: Path, metrics: dict, stdout: str) -> None:
    """validate_best=false: no final validation, but the validations that ran inside fit are
    measured results: metrics.json holds the last one (what `mate report` reads)."""
    with open(run / "csv" / "metrics.csv", newline="") as handle:  # Lightning's rows carry the epoch
        inside_fit = [r for r in csv.DictReader(handle) if r.get("val/loss") and r.get("epoch")]
    assert len(inside_fit) == 3  # after every step
    assert metrics["val/loss"] == pytest.approx(float(inside_fit[-1]["val/loss"]))
    assert metrics["val/loss"] != pytest.approx(float(inside_fit[0]["val/loss"]))  # the last one, not the first
    assert metrics["val/accuracy"] == pytest.approx(float(inside_fit[-1]["val/accuracy"]))
    shown = " ".join(stdout.split())  # rich wraps a title to its table's width
    assert "no final validation: the last validation during training (val/*) and training batch (train/*)" in shown
    assert "val/accuracy" in shown and "train/loss" in shown
