"""Runs -> configurations, each metric over seeds as the paper reports it: median and half the interquartile
range, ``(Q3 - Q1) / 2`` (numpy's linear percentiles), and ``n``. A seed finished more than once counts once, by its
newest run.

A configuration is the dataset, experiment, attention, MATE's ``variant/impl`` and every other override whose value
differs between the runs (a heads-ablation sweep: a row per ``attention.row_heads_ratio``); never the seed. A run
whose group choices are lost (:func:`mate_cli.report.collect.recover_choices`) and cannot be told from its resolved
config is in no row: it is listed as failed, unreadable.

The rows go per dataset first (its choice, then the ``dataset.*`` overrides that differ: another root, another
length), so runs over several tasks read as one task's configurations after another: MATE against dense, per task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from mate_cli.errors import MateError
from mate_cli.run.stages import PREFIX as STAGE_PREFIX
from mate_cli.report.collect import FAILED_STATUS, INCOMPLETE, OK, Run, runs_with

BASE_COLUMNS = ("dataset", "experiment", "attention", "impl")
#: overrides that never name a configuration (seeds repeat one, a resume continues one, base columns show some,
#: a sweep preset sets others, ``export_encoder`` and ``tags`` change nothing trained)
NOT_CONFIGURATION = ("seed", "ckpt_path", "experiment", "attention", "dataset", "attention.variant", "attention.impl",
                     "sweep", "export_encoder", "tags")  # fmt: skip
#: neither do these groups: where results go and what is printed
NOT_CONFIGURATION_GROUPS = ("logger", "paths", "hydra", "extras")
PERF_METRICS = ("perf/examples_per_s", "perf/peak_mem_mb")
THROUGHPUT = "perf/examples_per_s"
#: the wall minutes a run's fit took, all its calls (resumptions) together; runs before it was recorded lack it
MINUTES = "time/fit_minutes"
MAIN_METRICS = ("val/hits@1", "val/f1")
MISSING = "-"


@dataclass(frozen=True)
class Summary:
    median: float
    half_iqr: float
    n: int
    values: tuple[float, ...]

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)


def summarize(values: Iterable[float]) -> Summary | None:
    values = tuple(float(v) for v in values)
    if not values:
        return None
    q1, median, q3 = np.percentile(np.asarray(values), [25, 50, 75])
    return Summary(median=float(median), half_iqr=float((q3 - q1) / 2), n=len(values), values=values)


@dataclass
class Configuration:
    """The runs that differ only by seed."""

    key: dict[str, str]
    runs: list[Run] = field(default_factory=list)
    baseline: Run | None = None  # the trivial baseline of its data (mate_cli.report.baselines)

    def counted(self) -> list[Run]:
        """The finished runs summarised: one per seed, the newest to finish."""
        newest: dict[object, Run] = {}
        for run in runs_with(self.runs, OK):
            seed = id(run) if run.seed is None else str(run.seed)
            if seed not in newest or (run.finished, run.name) > (newest[seed].finished, newest[seed].name):
                newest[seed] = run
        return sorted(newest.values(), key=lambda run: run.name)

    def repeated(self) -> list[tuple[Run, list[Run]]]:
        """Each seed that finished more than once: the counted run and the others."""
        ok = runs_with(self.runs, OK)
        found = [(run, [r for r in ok if r is not run and str(r.seed) == str(run.seed)]) for run in self.counted()]
        return [(run, sorted(others, key=lambda r: r.name)) for run, others in found if others and run.seed is not None]

    def by_seed(self) -> list[tuple[str, Run]]:
        """``(seed, run)`` of each seed, in seed order: its counted run, else (none finished) its unfinished run, the
        last by name (:attr:`Run.mark` says how it ended)."""
        runs = {seed_label(run): run for run in sorted(self.runs, key=lambda r: r.name) if run.status != OK}
        runs.update((seed_label(run), run) for run in self.counted())
        return sorted(runs.items(), key=lambda item: natural(item[0]))

    def counted_by_seed(self) -> list[tuple[str, Run]]:
        """``(seed, run)`` of each counted run, in seed order."""
        return [(seed, run) for seed, run in self.by_seed() if run.status == OK]

    def summary(self, metric: str) -> Summary | None:
        return summarize(run.metrics[metric] for run in self.counted() if metric in run.metrics)

    def count(self, status: str) -> int:
        """Runs with ``status``; for ``ok``, the counted ones."""
        return len(self.counted()) if status == OK else len(runs_with(self.runs, status))

    def runs_text(self) -> str:
        """``3``, or ``2 (+1 repeated, +1 failed, +1 incomplete)``."""
        repeats = sum(len(others) for _, others in self.repeated())
        extra = [f"+{n} {status}" for status, n in (("repeated", repeats), (FAILED_STATUS, self.count(FAILED_STATUS)),
                                                     (INCOMPLETE, self.count(INCOMPLETE))) if n]  # fmt: skip
        return f"{self.count(OK)}" + (f" ({', '.join(extra)})" if extra else "")


def seed_label(run: Run) -> str:
    """A run's seed as the per-seed lists name it (a run without one: its name)."""
    return run.name if run.seed is None else str(run.seed)


def natural(value: str) -> tuple:
    """A seed or key value as lists and rows sort by it: numbers by value (``2`` before ``10``), then words."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def _text(value) -> str:
    return MISSING if value is None else str(value)


def _family(target) -> str | None:
    """``mate_cli.modeling.attention.mate.MateAttention`` -> ``mate`` (a target's module)."""
    return target.rsplit(".", 2)[-2] if isinstance(target, str) and "." in target else None


def base_key(run: Run) -> dict[str, str | None]:
    """dataset (None: a run's lost choice), experiment, attention, impl (``variant/impl`` for MATE, else ``-``)."""
    attention = run.setting("attention") or run.setting("model.encoder.attention") or {}
    attention = attention if isinstance(attention, dict) else {}
    parts = [attention[k] for k in ("variant", "impl") if attention.get(k) is not None]
    dataset = run.setting("dataset") if isinstance(run.setting("dataset"), dict) else {}
    lost_dataset = run.choices_lost and "dataset" not in run.choices  # its node's family would name no dataset
    return {
        "dataset": None if lost_dataset else _text(run.choices.get("dataset") or _family(dataset.get("_target_"))),
        "experiment": _text(run.setting("experiment_name") or run.choices.get("experiment")),
        "attention": _text(run.choices.get("attention") or _family(attention.get("_target_"))),
        "impl": "/".join(map(str, parts)) or MISSING,
    }


def effective(run: Run, key: str) -> str | None:
    """What ``key`` was in ``run``: its group choice, else its config value, else its override (None: unknown, a run
    that lost its choices and overrides with ``.hydra/``). A stage's ``sweep:<dir>`` stays as given: each job found its
    own run there (:mod:`mate_cli.run.stages`), the seeds of one configuration different ones."""
    given = re.sub(r"\\(.)", r"\1", str(run.overrides.get(key, "")))  # as Hydra reads it: sweep\:<dir> is sweep:<dir>
    if given.startswith(STAGE_PREFIX):
        return given
    if key in run.choices:
        return _text(run.choices[key])
    value = run.setting(key)
    if value is not None and not isinstance(value, (dict, list)):
        return str(value)
    return None if run.choices_lost else _text(run.overrides.get(key))


def swept_keys(runs: Sequence[Run]) -> list[str]:
    """The override keys whose value differs between ``runs`` (but :data:`NOT_CONFIGURATION` ones)."""
    keys = sorted({k for run in runs for k in run.overrides})
    keys = [k for k in keys if k not in NOT_CONFIGURATION
            and not any(k == g or k.startswith((g + ".", g + "/")) for g in NOT_CONFIGURATION_GROUPS)]  # fmt: skip
    return [k for k in keys if len({effective(run, k) for run in runs} - {None}) > 1]


def configurations(runs: Sequence[Run]) -> list[Configuration]:
    """The runs by configuration, per dataset first (the dataset, then its swept ``dataset.*`` keys, then the other
    key columns); a run whose configuration is unknown (a lost choice) becomes failed, in none."""
    extra = swept_keys(runs)
    data = [k for k in extra if k.startswith("dataset.")]
    groups: dict[tuple, Configuration] = {}
    for run in runs:
        base = base_key(run)
        key = {"dataset": base.pop("dataset"), **{k: effective(run, k) for k in data}, **base,
               **{k: effective(run, k) for k in extra if k not in data}}  # fmt: skip
        if unknown := [k for k, value in key.items() if value is None]:
            run.status = FAILED_STATUS
            run.error = (
                f"unreadable .hydra/hydra.yaml: missing, and no other run has its {', '.join(unknown)} settings, "
                "so its configuration is unknown"
            )
            continue
        groups.setdefault(tuple(key.values()), Configuration(key)).runs.append(run)
    return [groups[k] for k in sorted(groups, key=lambda values: [natural(v) for v in values])]


def choose_metrics(runs: Sequence[Run], requested: Sequence[str] | None = None) -> list[str]:
    """``requested`` (each in some run's metrics), else the finished runs' ``val/*`` and :data:`PERF_METRICS`."""
    present = {k for run in runs_with(runs, OK) for k in run.metrics}
    if requested:
        unknown = [m for m in requested if m not in present]
        if unknown:
            shown = ", ".join(sorted(k for k in present if not k.startswith("data/"))) or "none"
            raise MateError(
                f"metrics={list(requested)}: {', '.join(unknown)} is in no run's metrics.json; metrics present: {shown}"
            )
        return list(dict.fromkeys(requested))
    return sorted(k for k in present if k.startswith("val/")) + [k for k in PERF_METRICS if k in present]


def main_metric(metrics: Sequence[str], requested: str | None = None) -> str | None:
    """``requested``, else the first of ``metrics`` in :data:`MAIN_METRICS`, else the first ``val/*``,
    else the first."""
    if requested:
        if requested not in metrics:
            raise MateError(
                f"main_metric={requested} is not among the metrics shown ({', '.join(metrics) or 'none'}); "
                "choose one of them"
            )
        return requested
    return next(
        (n for n in (*MAIN_METRICS, *(m for m in metrics if m.startswith("val/")), *metrics) if n in metrics), None
    )


def ordered(metrics: Sequence[str], main: str | None) -> list[str]:
    """The main metric first, then :data:`THROUGHPUT` (what a row is compared by), then the others as they came."""
    first = [m for m in dict.fromkeys((main, THROUGHPUT)) if m in metrics]
    return first + [m for m in metrics if m not in first]
