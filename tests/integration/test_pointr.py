"""PointR end to end through the real CLI: `mate train` both stages (tiny), then
`mate pointr` and `mate predict` on the bundled sample.

The two checkpoints are trained once per session (2 optimiser steps each, 128 tokens),
as subprocesses of the real `mate` entry point, with outputs and caches under a temp dir.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from mate_cli.metrics.hybridqa import evaluate_predictions, subset_reference
from tests.helpers import MATE, SAMPLE, build_edge_root, mate_env, new_run, run_dirs, run_mate

TABLES = SAMPLE / "WikiTables-WithLinks" / "tables_tok"
PASSAGES = SAMPLE / "WikiTables-WithLinks" / "request_tok"
TINY = ["trainer.max_steps=2", "dataset.max_length=128", "logger=csv", "validate_best=false"]


@pytest.fixture(scope="session")
def pointr_env(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("pointr")
    return mate_env(base / "outputs", base / "cache")


@pytest.fixture(scope="session")
def checkpoints(pointr_env) -> dict[str, Path]:
    """Tiny stage-1 (dense TAPAS-style cell selector) and stage-2 (reader) checkpoints.

    The two `mate train` runs start together (their start-up and preprocessing overlap)."""
    out = Path(pointr_env["MATE_OUTPUT_DIR"])
    runs = {"stage1": ["experiment=hybridqa_tapas"], "stage2": ["experiment=hybridqa_reader", "dataset.batch_size=4"]}
    procs = {}
    for name, args in runs.items():
        env = {**pointr_env, "MATE_OUTPUT_DIR": str(out / name)}
        cmd = [MATE, "train", *args, *TINY]
        procs[name] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found = {}
    for name, proc in procs.items():
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        (found[name],) = (out / name / "train").glob("*/checkpoints/last.ckpt")
    return found


@pytest.fixture(scope="module")
def pointr_run(checkpoints, pointr_env) -> tuple[Path, subprocess.CompletedProcess]:
    """One `mate pointr` run on the sample's validation tables."""
    out = Path(pointr_env["MATE_OUTPUT_DIR"])
    before = run_dirs(out, "pointr")
    proc = run_mate(["pointr", f"stage1.ckpt_path={checkpoints['stage1']}",
                 f"stage2.ckpt_path={checkpoints['stage2']}"], pointr_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return new_run(out, "pointr", before), proc


def test_pointr_writes_official_predictions_and_finite_metrics(pointr_run):
    run, proc = pointr_run
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
    assert "EM (%)" in proc.stdout and "hits@1" in proc.stdout


def test_pointr_survives_the_edge_cases(checkpoints, pointr_env, tmp_path):
    root = tmp_path / "edge"
    build_edge_root(root)
    out = Path(pointr_env["MATE_OUTPUT_DIR"])
    before = run_dirs(out, "pointr")
    overrides = f'stage1.overrides=["dataset.root={root}","dataset.split.mode=files","dataset.cache_dir={tmp_path / "c"}"]'
    proc = run_mate(["pointr", f"stage1.ckpt_path={checkpoints['stage1']}",
                 f"stage2.ckpt_path={checkpoints['stage2']}", overrides], pointr_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = new_run(out, "pointr", before)
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


def test_predict_prints_the_answer_cell_and_top3(checkpoints, pointr_env):
    out = Path(pointr_env["MATE_OUTPUT_DIR"])
    before = run_dirs(out, "predict")
    table = "1991_Monaco_Grand_Prix_0"
    question = "Which driver of Italy's team, the one with points = 4, finished third?"  # typed as is: no Hydra quoting
    proc = run_mate(["predict", f"table={TABLES / (table + '.json')}", f"passages={PASSAGES / (table + '.json')}",
                 f"question={question}",
                 f"stage1.ckpt_path={checkpoints['stage1']}", f"stage2.ckpt_path={checkpoints['stage2']}"], pointr_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "answer:" in proc.stdout and "cell: row" in proc.stdout and "top 3 cells" in proc.stdout
    result = json.loads((new_run(out, "predict", before) / "prediction.json").read_text())
    assert result["question"] == question
    rows = json.loads((TABLES / f"{table}.json").read_text())["data"]
    assert len(result["top_cells"]) == 3 and result["cell"] == result["top_cells"][0]
    probs = [c["prob"] for c in result["top_cells"]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-5
    for c in result["top_cells"]:
        assert c["text"] == rows[c["row"]][c["column"]][0]
    assert isinstance(result["answer"], str) and result["answer"] in result["context"]


def test_single_checkpoint_eval_still_works_and_agrees_on_hits(checkpoints, pointr_env, pointr_run):
    out = Path(pointr_env["MATE_OUTPUT_DIR"])
    before = run_dirs(out, "eval")
    proc = run_mate(["eval", f"ckpt_path={checkpoints['stage1']}"], pointr_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hits@1" in proc.stdout
    single = json.loads((new_run(out, "eval", before) / "metrics.json").read_text())
    pointr = json.loads((pointr_run[0] / "metrics.json").read_text())
    for k in (1, 3, 5):  # the pipeline's stage 1 is the evaluated cell selector, question for question
        assert pointr[f"stage1/hits@{k}"] == pytest.approx(single[f"val/hits@{k}"], abs=1e-6)


def test_test_split_gets_predictions_without_scores(checkpoints, tmp_path):
    from omegaconf import OmegaConf

    from mate_cli.pipelines.pointr import evaluate_pointr

    cfg = OmegaConf.create({
        "split": "test", "reference": None, "limit_questions": None, "trainer": {"accelerator": "cpu"},
        "stage1": {"ckpt_path": str(checkpoints["stage1"]), "overrides": [], "batch_size": 8, "top_k": 5},
        "stage2": {"ckpt_path": str(checkpoints["stage2"]), "overrides": [], "batch_size": 16},
    })
    metrics = evaluate_pointr(cfg, tmp_path)
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    test_ids = [r["question_id"] for r in json.loads((SAMPLE / "released_data" / "test.json").read_text())]
    assert [p["question_id"] for p in predictions] == test_ids and metrics["questions"] == 15
    assert all(isinstance(p["pred"], str) for p in predictions)
    assert not any(k.endswith("/em") or k.startswith("stage1/hits") for k in metrics)  # hidden answers: nothing to score


def test_user_errors_are_one_line(checkpoints, pointr_env, tmp_path):
    proc = run_mate(["pointr", f"stage1.ckpt_path={tmp_path / 'nope.ckpt'}", "stage2.ckpt_path=null"], pointr_env)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("mate: error: checkpoint not found")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_wrong_or_missing_checkpoints_raise_mate_errors(checkpoints, tmp_path):
    from omegaconf import OmegaConf

    from mate_cli.errors import MateError
    from mate_cli.pipelines.pointr import evaluate_pointr

    def cfg(stage1, stage2):
        return OmegaConf.create({"split": "validation", "trainer": {"accelerator": "cpu"},
                                 "stage1": {"ckpt_path": stage1}, "stage2": {"ckpt_path": stage2}})

    with pytest.raises(MateError, match="not SpanModule"):
        evaluate_pointr(cfg(str(checkpoints["stage1"]), str(checkpoints["stage1"])), tmp_path)
    with pytest.raises(MateError, match="not CellSelectionModule"):
        evaluate_pointr(cfg(str(checkpoints["stage2"]), None), tmp_path)
    with pytest.raises(MateError, match="stage1.ckpt_path is missing"):
        evaluate_pointr(cfg("???", str(checkpoints["stage2"])), tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written before the inputs are valid
