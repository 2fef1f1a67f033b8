"""The trivial baselines beside the rows: `mate baseline` runs (``task_name: baseline``) are no rows of their own;
each configuration is shown beside the newest finished baseline run of the same data (:func:`attach`).

The same data: the same dataset choice, ``_sample`` aside (``sqa_sample`` with the release's root is the release),
the same ``dataset.task``, and the same ``dataset.root`` as either of the two runs' configs holds it: composed
(``.hydra/config.yaml``: ``${paths.data_dir}/sqa_sample``, as `mate baseline` leaves it) or resolved
(``resolved_config.yaml``, as `mate train` also leaves it). A baseline's ``metrics.json`` holds ``val/accuracy`` and
the ``rule`` that scored it, and for TabFact ``val/accuracy_statement_only``, the statement-only model's."""

from __future__ import annotations

import os
from typing import Sequence

from mate_cli.report.aggregate import Configuration
from mate_cli.report.collect import OK, Run, composed_setting

ACCURACY = "val/accuracy"
STATEMENT_ONLY = "val/accuracy_statement_only"
RULE = "rule"


def shown_metric(run: Run | None, main: str | None) -> str | None:
    """What a row shows of its baseline: the main metric where the baseline has it, else ``val/accuracy``; None when
    it has neither (or there is none)."""
    if run is None:
        return None
    return next((metric for metric in (main, ACCURACY) if metric in run.metrics), None)


def data_key(run: Run) -> tuple[str, str] | None:
    """``(dataset choice without _sample, dataset.task)``; None for a run without both (not a table task)."""
    choice, task = run.choices.get("dataset"), run.setting("dataset.task")
    return None if choice is None or task is None else (str(choice).removesuffix("_sample"), str(task))


def roots(run: Run) -> set[str]:
    """``dataset.root`` as the run's configs hold it: resolved, and as composed."""
    found = (run.setting("dataset.root"), composed_setting(run, "dataset.root"))
    return {os.path.normpath(root) for root in found if isinstance(root, str) and root}


def same_data(run: Run, baseline: Run) -> bool:
    key = data_key(run)
    return key is not None and key == data_key(baseline) and bool(roots(run) & roots(baseline))


def attach(configurations: Sequence[Configuration], baselines: Sequence[Run]) -> list[Run]:
    """Set each configuration's ``baseline``: the newest finished baseline run of its data (None: none). Returns the
    finished baseline runs no configuration took."""
    finished = sorted((run for run in baselines if run.status == OK), key=lambda run: (run.finished, run.name))
    taken: set[int] = set()
    for conf in configurations:
        run = next((run for run in conf.runs if data_key(run) is not None), None)
        matching = [baseline for baseline in finished if run is not None and same_data(run, baseline)]
        conf.baseline = matching[-1] if matching else None
        taken.update(id(baseline) for baseline in matching)
    return [run for run in finished if id(run) not in taken]
