"""Configurations -> what `mate report` shows and writes: the table's text (screen and
``report.md``), ``report.csv`` (full precision) and the PNGs (matplotlib, Agg):

- ``report_<metric>.png``: per configuration, each seed's value (grey points), the
  median (diamond) and the half-IQR (bar);
- ``report_accuracy_vs_throughput.png``: the main metric against examples/s, one
  labelled point per configuration, half-IQR bars both ways (as DoT's Fig. 4);
- ``report_curve_<metric>.png``: the learning curve, the main metric against the training
  step at every validation of each run (its ``csv/metrics.csv``; ``start/<metric>``, the
  starting checkpoint's, at step 0), one line per run, one colour per configuration.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from mate_cli.bench.report import format_mb
from mate_cli.io import atomic_open, atomic_write_text
from mate_cli.report.aggregate import MISSING, THROUGHPUT, Configuration, Summary
from mate_cli.report.collect import FAILED_STATUS, INCOMPLETE, OK, Run, logged_rows

PLUS_MINUS = "±"


def number(metric: str, value: float) -> str:
    """A metric's value as shown: memory in MB/GB, throughput with one decimal, scores with four."""
    if metric.endswith("_mb"):
        return format_mb(value) if value >= 10 else f"{value:.1f} MB"
    if metric.startswith("perf/"):
        return f"{value:,.1f}"
    return f"{value:.4f}"


def cell(metric: str, summary: Summary | None, finished: int) -> str:
    """``median ± half-IQR``, with ``(n=k)`` when fewer finished runs than the row's have it."""
    if summary is None:
        return MISSING
    text = f"{number(metric, summary.median)} {PLUS_MINUS} {number(metric, summary.half_iqr)}"
    return text + (f" (n={summary.n})" if summary.n != finished else "")


def table(configurations: Sequence[Configuration], metrics: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """The header and one row of text per configuration (key columns, runs, each metric)."""
    keys = list(configurations[0].key) if configurations else []
    rows = [
        [*conf.key.values(), conf.runs_text(), *(cell(m, conf.summary(m), conf.count(OK)) for m in metrics)]
        for conf in configurations
    ]
    return [*keys, "runs", *metrics], rows


def failed_lines(runs: Sequence[Run], quote: str = "") -> list[str]:
    return [f"{quote}{run.name}{quote}: {run.error}" for run in runs]


def incomplete_lines(runs: Sequence[Run], quote: str = "") -> list[str]:
    return [f"{quote}{run.name}{quote} (no metrics.json, no FAILED: killed or still running)" for run in runs]


def markdown(source: str, columns: Sequence[str], rows: Sequence[Sequence[str]], main: str | None,
             failed: Sequence[Run], incomplete: Sequence[Run], skipped: Sequence[Run] = ()) -> str:  # fmt: skip
    """``report.md``: the table, then the failed and the incomplete runs."""

    def esc(text: str) -> str:
        return str(text).replace("|", "\\|")

    first_number = columns.index("runs") if "runs" in columns else len(columns)
    out = [
        f"# mate report: `{source}`\n",
        f"One row per configuration; each metric is the median {PLUS_MINUS} half-IQR over seeds "
        f"(runs: finished runs; `(n=k)` where fewer have the metric). Main metric: `{main or MISSING}`.\n",
        "| " + " | ".join(map(esc, columns)) + " |",
        "|" + "".join("---:|" if i >= first_number else "---|" for i in range(len(columns))),
        *("| " + " | ".join(map(esc, row)) + " |" for row in rows),
        "",
    ]
    for title, lines in (("Failed runs", failed_lines(failed, "`")), ("Incomplete runs", incomplete_lines(incomplete, "`"))):
        out.append(f"## {title} ({len(lines)})\n")
        out.extend([f"- {line}" for line in lines] or ["none"])
        out.append("")
    if skipped:
        out.append(f"Left out: {len(skipped)} run(s) of other tasks ({', '.join(sorted({str(r.task) for r in skipped}))}).\n")
    return "\n".join(out)


def write_csv(configurations: Sequence[Configuration], metrics: Sequence[str], path: Path) -> Path:
    """``report.csv``: key columns, run counts, then ``<metric>_median``, ``_half_iqr``, ``_n``."""
    keys = list(configurations[0].key) if configurations else []
    stats = [f"{m}_{part}" for m in metrics for part in ("median", "half_iqr", "n")]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*keys, "runs_ok", "runs_failed", "runs_incomplete", *stats],
                            lineterminator="\n")  # fmt: skip
    writer.writeheader()
    for conf in configurations:
        row = {**conf.key, "runs_ok": conf.count(OK), "runs_failed": conf.count(FAILED_STATUS),
               "runs_incomplete": conf.count(INCOMPLETE)}  # fmt: skip
        for metric in metrics:
            summary = conf.summary(metric)
            row[f"{metric}_median"] = "" if summary is None else repr(summary.median)
            row[f"{metric}_half_iqr"] = "" if summary is None else repr(summary.half_iqr)
            row[f"{metric}_n"] = 0 if summary is None else summary.n
        writer.writerow(row)
    return atomic_write_text(path, buffer.getvalue())


# ------------------------------------------------------------------ plots
def labels(configurations: Sequence[Configuration]) -> list[str]:
    """Each configuration's name in a plot: the key columns that differ between them."""
    keys = list(configurations[0].key) if configurations else []
    varying = [k for k in keys if len({c.key[k] for c in configurations}) > 1] or ["experiment"]
    out = []
    for conf in configurations:
        parts = [conf.key[k] if k in ("experiment", "attention", "impl", "dataset") else f"{k.rsplit('.', 1)[-1]}={conf.key[k]}"
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


def _save(fig, path: Path, dpi: int) -> Path:
    plt = _pyplot()
    try:
        fig.tight_layout()
        with atomic_open(path, "wb") as handle:
            fig.savefig(handle, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return path


def plot_metric(configurations: Sequence[Configuration], metric: str, path: Path, dpi: int = 90) -> Path | None:
    """Per configuration: the seeds' values, the median and its half-IQR bar."""
    summaries = [conf.summary(metric) for conf in configurations]
    if not any(summaries):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.4 * len(configurations) + 1.5), 4.2))
    legend = {"seeds": "seed", "median": f"median {PLUS_MINUS} half-IQR"}
    for i, summary in enumerate(summaries):
        if summary is None:
            continue
        offsets = np.linspace(-0.15, 0.15, summary.n) if summary.n > 1 else np.zeros(1)
        ax.scatter(i + offsets, summary.values, s=18, color="tab:gray", alpha=0.8, zorder=2, label=legend.pop("seeds", None))
        ax.errorbar(i, summary.median, yerr=summary.half_iqr, fmt="D", color="tab:blue", capsize=6, markersize=7,
                    zorder=3, label=legend.pop("median", None))  # fmt: skip
    ax.set_xticks(range(len(configurations)), labels(configurations), fontsize=7)
    ax.set_xlim(-0.6, len(configurations) - 0.4)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: seeds, median {PLUS_MINUS} half-IQR per configuration", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path, dpi)


def plot_accuracy_vs_throughput(configurations: Sequence[Configuration], main: str, path: Path, dpi: int = 90) -> Path | None:
    """``main`` (y) against examples/s (x), one labelled point per configuration."""
    points = [(label, conf.summary(THROUGHPUT), conf.summary(main)) for conf, label in zip(configurations, labels(configurations))]
    points = [(label, x, y) for label, x, y in points if x is not None and y is not None]
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    for label, x, y in points:
        ax.errorbar(x.median, y.median, xerr=x.half_iqr, yerr=y.half_iqr, fmt="o", capsize=3, markersize=6)
        ax.annotate(label, (x.median, y.median), textcoords="offset points", xytext=(6, 4), fontsize=7, va="bottom")
    ax.margins(x=0.25, y=0.15)
    ax.set_xlabel("examples/s (median over seeds)")
    ax.set_ylabel(f"{main} (median over seeds)")
    ax.set_title("accuracy vs throughput (bars: half-IQR over seeds)", fontsize=9)
    ax.grid(True, alpha=0.3)
    return _save(fig, path, dpi)


def learning_curve(run: Run, metric: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``metric`` at every validation the run logged (``csv/metrics.csv``),
    with the starting checkpoint's value (``start/<metric>`` in ``metrics.json``) at step 0."""
    points = {}
    if f"start/{metric}" in run.metrics:
        points[0] = float(run.metrics[f"start/{metric}"])
    for row in logged_rows(run.path):
        if row.get(metric) not in (None, "") and row.get("step") not in (None, ""):
            points[int(float(row["step"]))] = float(row[metric])
    return sorted(points.items())


def plot_learning_curves(configurations: Sequence[Configuration], metric: str, path: Path, dpi: int = 90) -> Path | None:
    """``metric`` against the training step, a line per run, a colour per configuration."""
    curves = [(label, [learning_curve(run, metric) for run in conf.runs])
              for conf, label in zip(configurations, labels(configurations))]
    if not any(len(points) > 1 for _, runs in curves for points in runs):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, (label, runs) in enumerate(curves):
        for j, points in enumerate(p for p in runs if p):
            steps, values = zip(*points)
            ax.plot(steps, values, marker="o", markersize=3, color=f"C{i}", alpha=0.85, label=None if j else label)
    ax.set_xlabel("training step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} during training (a line per run)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path, dpi)


def plot(configurations: Sequence[Configuration], metrics: Sequence[str], main: str | None, out_dir: Path) -> list[Path]:
    """``report_<metric>.png`` for every metric any run has, accuracy vs throughput when the
    runs measured it, and the main metric's learning curves when the runs logged them."""
    paths = [plot_metric(configurations, m, out_dir / f"report_{slug(m)}.png") for m in metrics]
    if main and main != THROUGHPUT and THROUGHPUT in metrics:
        paths.append(plot_accuracy_vs_throughput(configurations, main, out_dir / "report_accuracy_vs_throughput.png"))
    if main:
        paths.append(plot_learning_curves(configurations, main, out_dir / f"report_curve_{slug(main)}.png"))
    return [p for p in paths if p is not None]
