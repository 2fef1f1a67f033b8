"""Scores `mate eval` gave a row's checkpoints, beside the row: an eval run whose ``metrics.json`` says ``tables:
shuffled`` (`mate eval tables=shuffled`: each TabFact statement read with another table) adds each of its ``val/*``
metrics to the training run whose checkpoint it scored (``ckpt_path`` inside that run's dir) as
``val/<name>_shuffled_tables``, so the row's medians, ranges and ``report.csv`` hold it as any metric.

It counts only as a score of the run as it is: written after the run's ``metrics.json`` (not of a state a resumed run
went past), of the validation split, and with the run's own settings (no ``overrides=``). Of several, the newest."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from mate_cli.report.collect import OK, Run

#: `mate eval`'s task
EVAL = "eval"
SUFFIX = "_shuffled_tables"


def scores_run_as_it_is(evaluation: Run, run: Run) -> bool:
    """A finished shuffled-table evaluation of ``run``'s validation split with its settings, after it finished."""
    changed = evaluation.overrides.get("overrides", "[]") not in ("[]", "")
    split = evaluation.overrides.get("split", "validation")
    return (
        evaluation.task == EVAL
        and evaluation.status == OK
        and evaluation.texts.get("tables") == "shuffled"
        and split == "validation"
        and not changed
        and evaluation.finished >= run.finished
    )


def attach(runs: Sequence[Run], evaluations: Sequence[Run]) -> tuple[list[Run], list[Run]]:
    """Sets each run's ``val/*_shuffled_tables`` from the newest evaluation that scores it as it is. Returns
    ``(attached, the other evaluations)``: the other ones stay left out."""
    owners = {run.path.resolve(): run for run in runs}
    newest: dict[int, Run] = {}
    other = []
    for evaluation in evaluations:
        scored = Path(evaluation.texts.get("ckpt_path") or "/").resolve()
        owner = next((owners[folder] for folder in scored.parents if folder in owners), None)
        if owner is None or not scores_run_as_it_is(evaluation, owner):
            other.append(evaluation)
            continue
        earlier = newest.get(id(owner))
        if earlier is not None and (earlier.finished, earlier.name) > (evaluation.finished, evaluation.name):
            other.append(evaluation)
            continue
        if earlier is not None:
            other.append(earlier)
        newest[id(owner)] = evaluation
    by_id = {id(run): run for run in runs}
    for key, evaluation in newest.items():
        metrics = by_id[key].metrics
        for name in [name for name in metrics if name.endswith(SUFFIX)]:
            del metrics[name]
        metrics.update({f"{k}{SUFFIX}": v for k, v in evaluation.metrics.items() if k.startswith("val/")})
    return list(newest.values()), other
