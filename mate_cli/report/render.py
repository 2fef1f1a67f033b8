"""Configurations -> what ``mate report`` shows and writes: the table's text (screen and ``report.md``), ``report.csv``
(full precision), and the plots (matplotlib, Agg) in each of ``formats`` (:func:`plot`)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from mate_cli.bench.results import format_mb
from mate_cli.io import atomic_open, atomic_write_csv
from mate_cli.report import baselines, rescored
from mate_cli.report.aggregate import BASE_COLUMNS, MINUTES, MISSING, THROUGHPUT, Configuration, Summary
from mate_cli.report.collect import FAILED_STATUS, INCOMPLETE, OK, Run, logged_rows

PLUS_MINUS = "±"
EN_DASH = "–"


def number(metric: str, value: float) -> str:
    """A metric's value as shown: memory in MB/GB, throughput with one decimal, scores with four."""
    if metric.endswith("_mb"):
        return format_mb(value) if value >= 10 else f"{value:.1f} MB"
    if metric.startswith("perf/"):
        return f"{value:,.1f}"
    return f"{value:.4f}"


def cell(metric: str, summary: Summary | None, finished: int) -> str:
    """``median ± half-IQR`` (one run: its value), with ``(n=k)`` when fewer finished runs than the row's have it."""
    if summary is None:
        return MISSING
    text = number(metric, summary.median)
    if summary.n > 1:
        text += f" {PLUS_MINUS} {number(metric, summary.half_iqr)}"
    return text + (f" (n={summary.n})" if summary.n != finished else "")


def spread(metric: str, summary: Summary | None) -> str:
    """``min–max`` over the counted seeds (fewer than two: ``-``)."""
    if summary is None or summary.n < 2:
        return MISSING
    return f"{number(metric, summary.low)}{EN_DASH}{number(metric, summary.high)}"


def seed_values(conf: Configuration, metric: str, text=number) -> str:
    """``1: 0.4120, 2: cut, 3: failed``: each seed's value of ``metric`` (``text`` writes it), or how its run ended
    where none finished."""
    return ", ".join(f"{seed}: {seed_value(run, metric, text)}" for seed, run in conf.by_seed()) or MISSING


def seed_value(run: Run, metric: str, text=number) -> str:
    """A seed's run in the per-seed list: its value of ``metric``, or how it ended (:attr:`Run.mark`)."""
    if run.status != OK:
        return run.mark
    return MISSING if metric not in run.metrics else text(metric, run.metrics[metric])


def minutes(conf: Configuration, text=lambda value: f"{value:.1f}") -> str:
    """``1: 12.3, 2: -``: the minutes each counted run's fit took (``-``: a run from before they were recorded)."""
    runs = conf.counted_by_seed()
    if not any(MINUTES in run.metrics for _, run in runs):
        return MISSING
    return ", ".join(
        f"{seed}: {text(run.metrics[MINUTES]) if MINUTES in run.metrics else MISSING}" for seed, run in runs
    )


def trivial_baseline(run: Run | None, main: str | None, text=number) -> str:
    """A baseline run's score as its cell: ``0.1111 (every cell of column 1)``, the main metric where the baseline has
    it (else ``val/accuracy``, named), then TabFact's statement-only model's: ``; 0.5000 (statement only)``."""
    metric = baselines.shown_metric(run, main)
    if metric is None:
        return MISSING
    named = "" if metric == main else f"{metric} "
    parts = [f"{named}{text(metric, run.metrics[metric])} ({run.texts.get(baselines.RULE, 'rule')})"]
    if baselines.STATEMENT_ONLY in run.metrics:
        parts.append(f"{text(baselines.STATEMENT_ONLY, run.metrics[baselines.STATEMENT_ONLY])} (statement only)")
    return "; ".join(parts)


#: the columns beside the metrics: the main metric's range and each seed's value, the trivial baseline of the row's
#: data, each counted run's minutes
RANGE, BY_SEED, BASELINE, MINUTES_COLUMN = "range", "by seed", "trivial baseline", "minutes"
#: the columns of lists and words, not numbers: left-aligned in report.md
TEXT_COLUMNS = (BY_SEED, BASELINE, MINUTES_COLUMN)


def value_columns(metrics: Sequence[str], main: str | None,
                  baseline: bool = False) -> list[tuple[str, Callable[[Configuration], str]]]:  # fmt: skip
    """The table's columns after ``runs``, each with what writes its cell: each metric; after the main metric its
    range, by-seed list and (``baseline``) trivial baseline; the minutes after the throughput (none shown: after the
    main metric's, else first)."""
    out: list[tuple[str, Callable[[Configuration], str]]] = []
    for metric in metrics:
        out.append((metric, lambda conf, m=metric: cell(m, conf.summary(m), conf.count(OK))))
        if metric == main:
            out += [(RANGE, lambda conf: spread(main, conf.summary(main))), (BY_SEED, lambda c: seed_values(c, main))]
            out += [(BASELINE, lambda conf: trivial_baseline(conf.baseline, main))] if baseline else []
    names = [name for name, _ in out]
    after = next((names.index(n) + 1 for n in (THROUGHPUT, BASELINE, BY_SEED) if n in names), 0)
    return [*out[:after], (MINUTES_COLUMN, minutes), *out[after:]]


def table(configurations: Sequence[Configuration], metrics: Sequence[str],
          main: str | None = None) -> tuple[list[str], list[list[str]]]:  # fmt: skip
    """The header and a row per configuration: key columns, runs, then :func:`value_columns` (a trivial baseline
    column where a row has one)."""
    keys = list(configurations[0].key) if configurations else []
    shown = value_columns(metrics, main, any(conf.baseline for conf in configurations))
    rows = [[*conf.key.values(), conf.runs_text(), *(write(conf) for _, write in shown)] for conf in configurations]
    return [*keys, "runs", *(name for name, _ in shown)], rows


def failed_lines(runs: Sequence[Run], quote: str = "") -> list[str]:
    return [f"{quote}{run.name}{quote}: {run.error}" for run in runs]


def incomplete_lines(runs: Sequence[Run], quote: str = "") -> list[str]:
    cut = "cut: its checkpoints/last.ckpt is kept, running it again continues it"
    return [f"{quote}{run.name}{quote} (no metrics.json, no FAILED: {cut if run.cut else 'killed or still running'})"
            for run in runs]  # fmt: skip


def repeated_lines(configurations: Sequence[Configuration], quote: str = "") -> list[str]:
    return [f"seed {run.seed}: counted {quote}{run.name}{quote}; not counted "
            + ", ".join(f"{quote}{other.name}{quote}" for other in others)
            for conf in configurations for run, others in conf.repeated()]  # fmt: skip


def markdown(sources: Sequence[str], columns: Sequence[str], rows: Sequence[Sequence[str]], main: str | None,
             failed: Sequence[Run], incomplete: Sequence[Run], skipped: Sequence[Run] = (),
             repeated: Sequence[str] = ()) -> str:  # fmt: skip
    """``report.md``: the table, then the repeated seeds, the failed and the incomplete runs."""

    def esc(text: str) -> str:
        return str(text).replace("|", "\\|")

    first_number = columns.index("runs") if "runs" in columns else len(columns)
    numbers = [i >= first_number and name not in TEXT_COLUMNS for i, name in enumerate(columns)]  # right-aligned
    notes = (
        f" {BASELINE.capitalize()}: `mate baseline` on the same data, with its rule (TabFact: and the statement-only "
        "model's)." if BASELINE in columns else ""
    )  # fmt: skip
    if any(str(name).endswith(rescored.SUFFIX) for name in columns):
        notes += (
            f" `*{rescored.SUFFIX}`: `mate eval tables=shuffled` of the row's checkpoints, each statement read with "
            "another table of the split."
        )
    out = [
        f"# mate report: {', '.join(f'`{source}`' for source in sources)}\n",
        f"One row per configuration; each metric is the median {PLUS_MINUS} half-IQR over seeds "
        f"(runs: finished runs, one per seed; `(n=k)` where fewer have the metric). Main metric: `{main or MISSING}`; "
        f"{RANGE}: its lowest{EN_DASH}highest over the counted seeds; {BY_SEED}: each seed's value, or how its run "
        "ended where none finished (`cut`: stopped with its last.ckpt kept, `failed`, `incomplete`; not counted); "
        f"{MINUTES_COLUMN}: the wall minutes each counted run's fit took, all its calls together (`{MINUTES}`; "
        f"`{MISSING}`: a run from before they were recorded).{notes}\n",
        "| " + " | ".join(map(esc, columns)) + " |",
        "|" + "".join("---:|" if right else "---|" for right in numbers),
        *("| " + " | ".join(map(esc, row)) + " |" for row in rows),
        "",
    ]
    if repeated:
        out += [f"## Repeated seeds ({len(repeated)}): the newest finished run of each is counted\n"]
        out += [*(f"- {line}" for line in repeated), ""]
    for title, lines in (
        ("Failed runs", failed_lines(failed, "`")),
        ("Incomplete runs", incomplete_lines(incomplete, "`")),
    ):
        out += [f"## {title} ({len(lines)})\n", *([f"- {line}" for line in lines] or ["none"]), ""]
    if skipped:
        out.append(
            f"Left out: {len(skipped)} run(s) of other tasks ({', '.join(sorted({str(r.task) for r in skipped}))}).\n"
        )
    return "\n".join(out)


#: report.csv's trivial baseline columns
BASELINE_CSV = ("baseline_run", "baseline_rule", "baseline_metric", "baseline_value", "baseline_statement_only")


def baseline_numbers(run: Run | None, main: str | None) -> dict[str, str]:
    """:data:`BASELINE_CSV` of a row's trivial baseline (none: empty)."""
    metric = baselines.shown_metric(run, main)
    if metric is None:
        return dict.fromkeys(BASELINE_CSV, "")
    values = [repr(run.metrics[key]) if key in run.metrics else "" for key in (metric, baselines.STATEMENT_ONLY)]
    return dict(zip(BASELINE_CSV, [run.name, run.texts.get(baselines.RULE, ""), metric, *values]))


def write_csv(configurations: Sequence[Configuration], metrics: Sequence[str], path: Path,
              main: str | None = None) -> Path:  # fmt: skip
    """``report.csv``: key columns, run counts, then ``<metric>_median``, ``_half_iqr``, ``_n``, ``_min``, ``_max``,
    ``<main>_by_seed`` (each seed's value), ``minutes_by_seed`` and :data:`BASELINE_CSV`, in full precision."""
    keys = list(configurations[0].key) if configurations else []
    stats = [f"{m}_{part}" for m in metrics for part in ("median", "half_iqr", "n", "min", "max")]
    by_seed = [f"{main}_by_seed"] if main in metrics else []
    rows = []
    for conf in configurations:
        row = {**conf.key, "runs_ok": conf.count(OK), "runs_failed": conf.count(FAILED_STATUS),
               "runs_incomplete": conf.count(INCOMPLETE)}  # fmt: skip
        for metric in metrics:
            summary = conf.summary(metric)
            row[f"{metric}_median"] = "" if summary is None else repr(summary.median)
            row[f"{metric}_half_iqr"] = "" if summary is None else repr(summary.half_iqr)
            row[f"{metric}_n"] = 0 if summary is None else summary.n
            row[f"{metric}_min"] = "" if summary is None else repr(summary.low)
            row[f"{metric}_max"] = "" if summary is None else repr(summary.high)
        if by_seed:
            row[by_seed[0]] = seed_values(conf, main, lambda _, value: repr(value))
        row["minutes_by_seed"] = minutes(conf, repr)
        row.update(baseline_numbers(conf.baseline, main))
        rows.append(row)
    header = [*keys, "runs_ok", "runs_failed", "runs_incomplete", *stats, *by_seed, "minutes_by_seed", *BASELINE_CSV]
    return atomic_write_csv(path, header, rows)


#: how a plot names a metric (others: ``<name> (<split>)`` from ``<split>/<name>``)
METRIC_LABELS = {
    "val/hits@1": "Hits@1 (validation)", "val/hits@3": "Hits@3 (validation)", "val/hits@5": "Hits@5 (validation)",
    "val/loss": "Loss (validation)", "val/em": "EM (validation)", "val/f1": "F1 (validation)",
    "val/accuracy": "Accuracy (validation)", "val/mlm_loss": "Masked-LM loss (held-out tables)",
    "val/mlm_accuracy": "Masked-LM accuracy (held-out tables)",
    "perf/examples_per_s": "Training throughput (examples/s)", "perf/tokens_per_s": "Training throughput (tokens/s)",
    "perf/peak_mem_mb": "Peak memory (MB)",
}  # fmt: skip
SPLIT_WORDS = {"val": "validation", "test": "test", "train": "training", "start/val": "validation, at start"}
FORMATS = ("png", "pdf", "svg")


def metric_label(metric: str) -> str:
    """``val/hits@1`` -> ``Hits@1 (validation)``: :data:`METRIC_LABELS`, else from the key."""
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric]
    split, _, name = metric.rpartition("/")
    return f"{name} ({SPLIT_WORDS.get(split, split)})" if split else metric


def labels(configurations: Sequence[Configuration]) -> list[str]:
    """Each configuration's name in a plot: the key columns that differ between them."""
    from mate_cli.report.screen import short_value

    keys = list(configurations[0].key) if configurations else []
    varying = [k for k in keys if len({c.key[k] for c in configurations}) > 1] or ["experiment"]
    out = []
    for conf in configurations:
        parts = [conf.key[k] if k in BASE_COLUMNS else f"{k.rsplit('.', 1)[-1]}={short_value(conf.key[k])}"
                 for k in varying if conf.key[k] != MISSING]  # fmt: skip
        out.append("\n".join(parts) or MISSING)
    return out


def slug(metric: str) -> str:
    """``val/hits@1`` -> ``val_hits_1`` (file names)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", metric).strip("_")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _y_from_zero(ax, values: Sequence[float]) -> None:
    """Start the y axis at 0 when every value is ≥ 0, so heights compare as they are; else say so in its label."""
    if values and min(values) >= 0:
        ax.set_ylim(0, max(max(values) * 1.08, ax.get_ylim()[1]))  # room above the highest
    else:
        ax.set_ylabel(f"{ax.get_ylabel()} (axis not from 0)")


def _finish(fig, ax, title: str, title_width: float, path: Path, formats: Sequence[str], grid_axis: str = "both",
            **legend) -> list[Path]:  # fmt: skip
    """Title (wrapped to the figure's width: about 14 characters an inch at 9 pt), grid and legend, then the figure
    saved as ``path`` in each of ``formats`` and closed."""
    ax.set_title("\n".join(textwrap.wrap(title, max(30, int(title_width * 14)))), fontsize=9)
    ax.grid(True, axis=grid_axis, alpha=0.3)
    ax.legend(fontsize=7, **legend)
    written = []
    try:
        fig.tight_layout()
        for fmt in formats:
            target = path.with_suffix(f".{fmt}")
            with atomic_open(target, "wb") as handle:
                fig.savefig(handle, format=fmt, dpi=90, bbox_inches="tight")  # legends outside the axes included
            written.append(target)
    finally:
        _pyplot().close(fig)
    return written


def plot_metric(configurations: Sequence[Configuration], metric: str, path: Path,
                formats: Sequence[str] = ("png",)) -> list[Path]:  # fmt: skip
    """Per configuration: each seed's value, the median and its half-IQR bar (a single run: its point alone)."""
    summaries = [conf.summary(metric) for conf in configurations]
    if not any(summaries):
        return []
    plt = _pyplot()
    width = max(4.5, 1.4 * len(configurations) + 1.5)
    fig, ax = plt.subplots(figsize=(width, 4.2))
    legend = {"seeds": "a seed", "median": f"median {PLUS_MINUS} half-IQR over seeds", "one": "one run"}
    for i, summary in enumerate(summaries):
        if summary is None:
            continue
        if summary.n == 1:
            ax.scatter([i], summary.values, s=40, marker="o", color="tab:blue", zorder=3, label=legend.pop("one", None))
            continue
        offsets = np.linspace(-0.15, 0.15, summary.n)
        ax.scatter(
            i + offsets, summary.values, s=18, color="tab:gray", alpha=0.8, zorder=2, label=legend.pop("seeds", None)
        )
        ax.errorbar(i, summary.median, yerr=summary.half_iqr, fmt="D", color="tab:blue", capsize=6, markersize=7,
                    zorder=3, label=legend.pop("median", None))  # fmt: skip
    ax.set_xticks(range(len(configurations)), labels(configurations), fontsize=7)
    ax.set_xlim(-0.6, len(configurations) - 0.4)
    ax.set_ylabel(metric_label(metric))
    _y_from_zero(ax, [v for s_ in summaries if s_ for v in (*s_.values, s_.median + s_.half_iqr)])
    n = max(s_.n for s_ in summaries if s_)
    title = f"{metric_label(metric)} per configuration"
    title += f" ({PLUS_MINUS} half the interquartile range over seeds)" if n > 1 else ""
    return _finish(fig, ax, title, width, path, formats, grid_axis="y")


def plot_accuracy_vs_throughput(configurations: Sequence[Configuration], main: str, path: Path,
                                formats: Sequence[str] = ("png",)) -> list[Path]:  # fmt: skip
    """``main`` against examples/s, a labelled point per configuration, half-IQR bars both ways (as DoT's Fig. 4)."""
    points = [
        (label, conf.summary(THROUGHPUT), conf.summary(main))
        for conf, label in zip(configurations, labels(configurations))
    ]
    points = [(label, x, y) for label, x, y in points if x is not None and y is not None]
    if not points:
        return []
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 4.8))
    for i, (label, x, y) in enumerate(points):
        spread = dict(xerr=x.half_iqr, yerr=y.half_iqr, capsize=3) if x.n > 1 or y.n > 1 else {}
        ax.errorbar(
            x.median, y.median, fmt="o", markersize=6, color=f"C{i % 10}", label=label.replace("\n", ", "), **spread
        )
    ax.margins(x=0.15, y=0.15)
    several = any(x.n > 1 or y.n > 1 for _, x, y in points)
    ax.set_xlabel(metric_label(THROUGHPUT) + (" (median over seeds)" if several else ""))
    ax.set_ylabel(metric_label(main) + (" (median over seeds)" if several else ""))
    low = ax.get_xlim()[0]  # throughput from 0 would squeeze the points into a corner: say where it starts
    if low > 0:
        ax.set_xlabel(f"{ax.get_xlabel()} (axis from {low:.3g})")
    _y_from_zero(ax, [y.median for _, _, y in points])
    title = f"{metric_label(main)} against throughput"
    title += " (bars: half the interquartile range over seeds)" if several else ""
    return _finish(fig, ax, title, 5.5, path, formats, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)


def learning_curve(run: Run, metric: str) -> list[tuple[int, float]]:
    """``(step, value)`` of each validation in the CSV log, ``start/<metric>`` at step 0."""
    points = {}
    if f"start/{metric}" in run.metrics:
        points[0] = float(run.metrics[f"start/{metric}"])
    for row in logged_rows(run.path):
        if row.get(metric) not in (None, "") and row.get("step") not in (None, ""):
            points[int(float(row["step"]))] = float(row[metric])
    return sorted(points.items())


def plot_learning_curves(configurations: Sequence[Configuration], metric: str, path: Path,
                         formats: Sequence[str] = ("png",)) -> list[Path]:  # fmt: skip
    """``metric`` against the training step, a line per run, a colour per configuration."""
    curves = [
        (label, [learning_curve(run, metric) for run in conf.runs])
        for conf, label in zip(configurations, labels(configurations))
    ]
    if not any(len(points) > 1 for _, runs in curves for points in runs):
        return []
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, (label, runs) in enumerate(curves):
        for j, points in enumerate(p for p in runs if p):
            steps, values = zip(*points)
            ax.plot(steps, values, marker="o", markersize=3, color=f"C{i}", alpha=0.85,
                    label=None if j else label.replace("\n", ", "))  # fmt: skip
    ax.set_xlabel("training step")
    ax.set_ylabel(metric_label(metric))
    _y_from_zero(ax, [v for _, runs in curves for points in runs for _, v in points])
    return _finish(fig, ax, f"{metric_label(metric)} during training (a line per run)", 6.5, path, formats)


def plot(configurations: Sequence[Configuration], metrics: Sequence[str], main: str | None, out_dir: Path,
         formats: Sequence[str] = ("png",)) -> list[Path]:  # fmt: skip
    """``report_<metric>`` per metric, ``report_accuracy_vs_throughput`` and the main metric's learning curves
    (``report_curve_<metric>``) when the runs have what they need."""
    paths = [
        p for m in metrics for p in plot_metric(configurations, m, out_dir / f"report_{slug(m)}.png", formats=formats)
    ]
    if main and main != THROUGHPUT and THROUGHPUT in metrics:
        paths += plot_accuracy_vs_throughput(
            configurations, main, out_dir / "report_accuracy_vs_throughput.png", formats=formats
        )
    if main:
        paths += plot_learning_curves(configurations, main, out_dir / f"report_curve_{slug(main)}.png", formats=formats)
    return paths
