"""PointR end to end: `mate train` both stages (tiny), then `mate pointr`, `mate predict`
and `mate eval` on the bundled sample, each command's own function on a config Hydra
composes in process (tests/inprocess.py).

The two checkpoints are the session's shared runs (tests/shared_runs.py: 2 optimiser
steps each, 128 tokens).
"""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from mate_cli.metrics.hybridqa import evaluate_predictions, subset_reference
from tests.helpers import SAMPLE, build_edge_root
from tests.inprocess import run_command

TABLES = SAMPLE / "WikiTables-WithLinks" / "tables_tok"
PASSAGES = SAMPLE / "WikiTables-WithLinks" / "request_tok"


@pytest.fixture(scope="module")
def checkpoints(trained) -> dict[str, Path]:
    """Tiny stage-1 (dense TAPAS-style cell selector) and stage-2 (reader) checkpoints: the
    session's shared runs (tests/shared_runs.py)."""
    return {stage: trained(f"pointr_{stage}") / "checkpoints" / "last.ckpt" for stage in ("stage1", "stage2")}


def run_printing(command: str, args: list[str], run: Path) -> str:
    """``run_command``, returning what it printed."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        run_command(command, args, run)
    return printed.getvalue()


@pytest.fixture(scope="module")
def pointr_run(checkpoints, module_tmp) -> tuple[Path, str]:
    """One `mate pointr` run on the sample's validation tables, and what it printed.

    Over 20 s: PointR end to end on the sample's validation tables.
    """
    run = module_tmp("pointr")
    return run, run_printing(
        "pointr", [f"stage1.ckpt_path={checkpoints['stage1']}", f"stage2.ckpt_path={checkpoints['stage2']}"], run
    )


def test_pointr_writes_official_predictions_and_finite_metrics(pointr_run):
    run, printed = pointr_run
    predictions = json.loads((run / "predictions.json").read_text())
    metrics = json.loads((run / "metrics.json").read_text())

    # official format: a list of {"question_id", "pred"} with string predictions, one per validation question
    assert isinstance(predictions, list) and len(predictions) == metrics["questions"] == 12
    assert all(set(p) == {"question_id", "pred"} and isinstance(p["pred"], str) for p in predictions)
    from mate_cli.data.datamodule import HybridQADataModule

    val_ids = [q.question_id for q in HybridQADataModule(root=str(SAMPLE)).questions("validation")]
    assert [p["question_id"] for p in predictions] == val_ids

    # EM/F1 are the official semantics on exactly these predictions; counts follow dev_reference.json
    reference = json.loads((SAMPLE / "released_data" / "dev_reference.json").read_text())
    expected = evaluate_predictions(predictions, subset_reference(reference, val_ids))
    for group in ("in_table", "in_passage", "total"):
        for key in ("em", "f1", "count"):
            assert metrics[f"{group}/{key}"] == pytest.approx(expected[group][key])
        assert math.isfinite(metrics[f"{group}/em"]) and 0 <= metrics[f"{group}/f1"] <= 100
    assert metrics["in_table/count"] + metrics["in_passage/count"] == 12 and metrics["missing"] == 0
    hits = [metrics[f"stage1/hits@{k}"] for k in (1, 3, 5)]
    assert all(0.0 <= h <= 1.0 for h in hits) and hits == sorted(hits)

    details = json.loads((run / "pointr_details.json").read_text())
    for d, p in zip(details, predictions):
        assert d["pred"] == p["pred"] and 1 <= len(d["top_cells"]) <= 5
        probs = [c["prob"] for c in d["top_cells"]]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-5
        assert d["cell"] == d["top_cells"][0]
    assert "EM (%)" in printed and "hits@1" in printed


def test_pointr_survives_the_edge_cases(checkpoints, tmp_path):
    root = tmp_path / "edge"
    build_edge_root(root)
    overrides = (
        f'stage1.overrides=["dataset.root={root}","dataset.split.mode=files","dataset.cache_dir={tmp_path / "c"}"]'
    )
    run = tmp_path / "run"
    run_command(
        "pointr",
        [f"stage1.ckpt_path={checkpoints['stage1']}", f"stage2.ckpt_path={checkpoints['stage2']}", overrides],
        run,
    )
    predictions = {p["question_id"]: p["pred"] for p in json.loads((run / "predictions.json").read_text())}
    metrics = json.loads((run / "metrics.json").read_text())
    assert len(predictions) == 5 and predictions["edge-all-empty"] == ""
    assert metrics["robustness/no_selectable_cell"] == 1
    assert metrics["robustness/missing_passage_file"] == 3  # two Marine questions + the blank table
    assert metrics["robustness/tables_without_passages"] == 3
    assert metrics["robustness/questions_without_candidate"] == 3  # nowhere, all-empty, empty (untokenised) cell
    assert metrics["total/count"] == 5 and metrics["in_table/count"] == 2 and metrics["in_passage/count"] == 1
    log = (run / "pointr.log").read_text()
    assert "pointr: 1 questions whose table has no selectable" in log
    assert "pointr: 3 questions whose table has no passage file" in log


def test_predict_prints_the_answer_cell_and_top3(checkpoints, tmp_path):
    table = "1991_Monaco_Grand_Prix_0"
    question = "Which driver of Italy's team, the one with points = 4, finished third?"  # typed as is: no Hydra quoting
    printed = run_printing(
        "predict",
        [
            f"table={TABLES / (table + '.json')}",
            f"passages={PASSAGES / (table + '.json')}",
            f"question={question}",
            f"stage1.ckpt_path={checkpoints['stage1']}",
            f"stage2.ckpt_path={checkpoints['stage2']}",
        ],
        tmp_path,
    )
    assert "answer:" in printed and "cell: row" in printed and "top 3 cells" in printed
    result = json.loads((tmp_path / "prediction.json").read_text())
    assert result["question"] == question
    rows = json.loads((TABLES / f"{table}.json").read_text())["data"]
    assert len(result["top_cells"]) == 3 and result["cell"] == result["top_cells"][0]
    probs = [c["prob"] for c in result["top_cells"]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-5
    for c in result["top_cells"]:
        assert c["text"] == rows[c["row"]][c["column"]][0]
    assert isinstance(result["answer"], str) and result["answer"] in result["context"]


def test_single_checkpoint_eval_still_works_and_agrees_on_hits(checkpoints, pointr_run, tmp_path):
    printed = run_printing("eval", [f"ckpt_path={checkpoints['stage1']}"], tmp_path)
    assert "hits@1" in printed
    single = json.loads((tmp_path / "metrics.json").read_text())
    pointr = json.loads((pointr_run[0] / "metrics.json").read_text())
    for k in (1, 3, 5):  # the pipeline's stage 1 is the evaluated cell selector, question for question
        assert pointr[f"stage1/hits@{k}"] == pytest.approx(single[f"val/hits@{k}"], abs=1e-6)


def test_test_split_gets_predictions_without_scores(checkpoints, tmp_path):
    from omegaconf import OmegaConf

    from mate_cli.pipelines.pointr import evaluate_pointr

    cfg = OmegaConf.create(
        {
            "split": "test",
            "reference": None,
            "limit_questions": None,
            "trainer": {"accelerator": "cpu"},
            "stage1": {"ckpt_path": str(checkpoints["stage1"]), "overrides": [], "batch_size": 8, "top_k": 5},
            "stage2": {"ckpt_path": str(checkpoints["stage2"]), "overrides": [], "batch_size": 16},
        }
    )
    metrics = evaluate_pointr(cfg, tmp_path)
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    test_ids = [r["question_id"] for r in json.loads((SAMPLE / "released_data" / "test.json").read_text())]
    assert [p["question_id"] for p in predictions] == test_ids and metrics["questions"] == 15
    assert all(isinstance(p["pred"], str) for p in predictions)
    assert not any(
        k.endswith("/em") or k.startswith("stage1/hits") for k in metrics
    )  # hidden answers: nothing to score


def test_user_errors_are_one_line(tmp_path):
    from mate_cli.errors import MateError

    with pytest.raises(MateError) as err:
        run_command("pointr", [f"stage1.ckpt_path={tmp_path / 'nope.ckpt'}", "stage2.ckpt_path=null"], tmp_path / "run")
    assert str(err.value).startswith("checkpoint not found") and "\n" not in str(err.value)


def test_wrong_or_missing_checkpoints_raise_mate_errors(checkpoints, tmp_path):
    from omegaconf import OmegaConf

    from mate_cli.errors import MateError
    from mate_cli.pipelines.pointr import evaluate_pointr

    def cfg(stage1, stage2):
        return OmegaConf.create(
            {
                "split": "validation",
                "trainer": {"accelerator": "cpu"},
                "stage1": {"ckpt_path": stage1},
                "stage2": {"ckpt_path": stage2},
            }
        )

    with pytest.raises(MateError, match="not SpanModule"):
        evaluate_pointr(cfg(str(checkpoints["stage1"]), str(checkpoints["stage1"])), tmp_path)
    with pytest.raises(MateError, match="not CellSelectionModule"):
        evaluate_pointr(cfg(str(checkpoints["stage2"]), None), tmp_path)
    with pytest.raises(MateError, match="stage1.ckpt_path is missing"):
        evaluate_pointr(cfg("???", str(checkpoints["stage2"])), tmp_path)
    empty = cfg(str(checkpoints["stage1"]), None)
    empty.stage2.batch_size = 0  # was range()'s bare ValueError after stage 1 had run
    with pytest.raises(MateError, match=r"^stage2\.batch_size=0 is invalid; use stage2\.batch_size=<N >= 1>$"):
        evaluate_pointr(empty, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written before the inputs are valid
