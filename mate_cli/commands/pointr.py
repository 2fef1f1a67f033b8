"""`mate pointr stage1.ckpt_path=... stage2.ckpt_path=...`: PointR end to end
(:func:`mate_cli.pipelines.pointr.evaluate_pointr` writes the files); prints EM/F1 by answer source and Hits@1/3/5."""

from __future__ import annotations

from omegaconf import DictConfig

from mate_cli.commands.common import hydra_app, print_table, quiet_third_party_logs
from mate_cli.run.job import run_dir
from mate_cli.console import print_outputs
from mate_cli.pipelines.pointr import evaluate_pointr


def pointr(cfg: DictConfig) -> dict:
    quiet_third_party_logs()
    metrics = evaluate_pointr(cfg, run_dir())
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    groups = [group for group in ("in_table", "in_passage", "total") if f"{group}/em" in metrics]
    rows = [(g, fmt(metrics[f"{g}/em"]), fmt(metrics[f"{g}/f1"]), str(metrics[f"{g}/count"])) for g in groups]
    print_table(f"PointR on {cfg.split} ({metrics['questions']} questions)", ("", "EM (%)", "F1 (%)", "count"), rows)
    hits = [f"hits@{k}={metrics[f'stage1/hits@{k}']:.4f}" for k in (1, 3, 5) if f"stage1/hits@{k}" in metrics]
    print("stage 1: " + (", ".join(hits) or "no answers to score"))
    files = {"metrics": "metrics.json", "predictions": "predictions.json", "details": "pointr_details.json"}
    print_outputs({"run dir": run_dir(), **{name: run_dir() / file for name, file in files.items()}})
    return metrics


main = hydra_app(__name__, pointr)
