"""Scores `mate eval` gave a row's checkpoints, beside the row: an eval run whose ``metrics.json`` says ``tables:
shuffled`` (`mate eval tables=shuffled`: each TabFact statement read with another table) adds each of its ``val/*``
metrics to the training run whose checkpoint it scored (``ckpt_path`` inside that run's dir) as
``val/<name>_shuffled_tables``, so the row's medians, ranges and ``report.csv`` hold it as any metric. Of several such
evaluations of one run, the newest counts."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from mate_cli.report.collect import OK, Run

#: `mate eval`'s task
EVAL = "eval"
SUFFIX = "_shuffled_tables"


def shuffled_tables(run: Run) -> bool:
    return run.task == EVAL and run.status == OK and run.texts.get("tables") == "shuffled"


def attach(runs: Sequence[Run], evaluations: Sequence[Run]) -> tuple[list[Run], list[Run]]:
    """Adds each shuffled-table evaluation's ``val/*`` metrics to the run it scored. Returns ``(attached, the other
    evaluations)``: the other ones (own tables, unfinished, or of a checkpoint no run here holds) stay left out."""
    owners = {run.path.resolve(): run for run in runs}
    attached, other = [], []
    for evaluation in sorted(evaluations, key=lambda run: (run.finished, run.name)):  # the newest written last
        scored = Path(evaluation.texts.get("ckpt_path") or "/").resolve()
        owner = next((owners[folder] for folder in scored.parents if folder in owners), None)
        if owner is None or not shuffled_tables(evaluation):
            other.append(evaluation)
            continue
        owner.metrics.update({f"{k}{SUFFIX}": v for k, v in evaluation.metrics.items() if k.startswith("val/")})
        attached.append(evaluation)
    return attached, other
