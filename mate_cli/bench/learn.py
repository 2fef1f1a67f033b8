"""The table of ``tools/learn.sh``: ``python -m mate_cli.bench.learn <folder>`` reads each ``<task>_<attention>_s<seed>/``
run dir (its ``metrics.json`` once complete, else the last validation of its CSV log) and ``baseline_<task>/``, and
prints one Markdown row per task and attention: the dev accuracy of each seed, the median and range of the complete
runs', SQA's and WikiTQ's top-cell share of each seed (``val/cell_top1``: how far cell selection has got where the
accuracy has not moved yet) and their dev accuracy with the other decoding (``val/accuracy_at_least_one_cell``, the same
weights decoded with ``model.head.at_least_one_cell=true``: the most probable cell where none passes 0.5; each
validation logs it), the trivial baselines beside them, examples/s and the minutes each run took (all its
calls; marked * where other runs shared the device, ``LEARN_LANES`` and ``LEARN_SWEEP``), then the settings the runs share
(``settings.txt``), and last SQA's Q1 / Q2 / Q3 of each run (``val/accuracy_q1`` to ``_q3``) and its accuracy on the
answers of one cell and of several (``val/accuracy_single_cell_answers``, ``val/accuracy_multi_cell_answers``)."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

from mate_cli.bench.e2e import folder_main, markdown_row
from mate_cli.metrics.sqa import ANSWER_SIZES, QUESTION_NUMBERS

RUN = re.compile(r"^(?P<task>[a-z]+\d*)_(?P<attention>[a-z_]+)_s(?P<seed>\d+)$")  #: wtq1024: WikiTQ at 1,024
METRIC = "val/accuracy"  #: the dev metric of every table task (SQA: ALL, its per-question accuracy)
TOP_CELL = "val/cell_top1"  #: SQA, WikiTQ: the share of questions with an answer cell whose most probable cell is one
#: SQA, WikiTQ: METRIC decoded with the most probable cell where none passes the threshold
AT_LEAST_ONE_CELL = "val/accuracy_at_least_one_cell"
#: SQA: the first, second and third question of a sequence
QUESTIONS = tuple(f"val/accuracy_q{n}" for n in QUESTION_NUMBERS)
#: SQA: the questions whose answer is one cell, and several
BY_ANSWER_SIZE = tuple(f"val/accuracy_{size}_cell_answers" for size in ANSWER_SIZES)


def last_logged(run: Path, key: str) -> float | None:
    """The last value of ``key`` in the run's CSV log (a run the budget cut before its end)."""
    path = run / "csv" / "metrics.csv"
    if not path.is_file():
        return None
    with open(path, encoding="utf-8", newline="") as handle:
        values = [row[key] for row in csv.DictReader(handle) if row.get(key)]
    return float(values[-1]) if values else None


def run_row(run: Path) -> dict:
    """What one run dir says: complete or not, its dev accuracy, examples/s, minutes."""
    metrics_file = run / "metrics.json"
    metrics = json.loads(metrics_file.read_text(encoding="utf-8")) if metrics_file.is_file() else {}
    seconds = run.parent / f"{run.name}.seconds"  # a line a call: its seconds, and the lanes that shared the device
    calls = [line.split() for line in seconds.read_text().splitlines() if line.strip()] if seconds.is_file() else []
    return {
        "complete": bool(metrics),
        "accuracy": metrics.get(METRIC, last_logged(run, METRIC)),
        "at_least_one_cell": metrics.get(AT_LEAST_ONE_CELL, last_logged(run, AT_LEAST_ONE_CELL)),
        "cell_top1": metrics.get(TOP_CELL, last_logged(run, TOP_CELL)),
        "question_groups": [metrics.get(key, last_logged(run, key)) for key in QUESTIONS + BY_ANSWER_SIZE],
        "examples_per_s": metrics.get("perf/examples_per_s", last_logged(run, "perf/examples_per_s")),
        "minutes": sum(int(call[0]) for call in calls) / 60 if calls else None,
        "calls": len(calls),
        "shared": max((int(call[1]) for call in calls if len(call) > 1), default=1),
    }


def runs(folder: Path) -> dict[tuple[str, str], dict[int, dict]]:
    """``{(task, attention): {seed: run row}}`` of every run dir in ``folder``."""
    found: dict[tuple[str, str], dict[int, dict]] = {}
    for run in sorted(path for path in Path(folder).iterdir() if path.is_dir()):
        name = RUN.match(run.name)
        if name and (run / "resolved_config.yaml").is_file():
            found.setdefault((name["task"], name["attention"]), {})[int(name["seed"])] = run_row(run)
    return found


def dev_side(task: str) -> str:
    """The task whose dev side a task's runs score: wtq1024's is wtq's; each synthetic corpus (synth, synth2, ...) is
    its own."""
    return task if task.rstrip("0123456789") == "synth" else task.rstrip("0123456789")


def baselines(folder: Path, task: str) -> str:
    """The task's trivial baselines (``mate baseline``) as one cell."""
    path = Path(folder) / f"baseline_{dev_side(task)}" / "metrics.json"
    if not path.is_file():
        return "-"
    metrics = json.loads(path.read_text(encoding="utf-8"))
    cells = [f"{metrics[METRIC]:.3f} ({metrics['rule']})"] if METRIC in metrics else []
    if "val/accuracy_statement_only" in metrics:
        cells.append(f"{metrics['val/accuracy_statement_only']:.3f} (statement only)")
    return "; ".join(cells) or "-"


def _number(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def table(folder: Path) -> str:
    header = ["task", "attention", "dev accuracy by seed", "median", "range", "top cell by seed",
              "at least one cell by seed", "trivial baselines", "examples/s", "minutes a run"]  # fmt: skip
    lines = [markdown_row(header), "|---|---|---|---:|---:|---|---|---|---:|---:|"]
    found = runs(folder)
    for (task, attention), seeds in found.items():
        scores = [row["accuracy"] for row in seeds.values() if row["complete"] and row["accuracy"] is not None]
        by_seed = ", ".join(
            f"{seed}: {_number(row['accuracy'], '{:.3f}')}{'' if row['complete'] else ' (not complete)'}"
            for seed, row in seeds.items()
        )
        speeds = [row["examples_per_s"] for row in seeds.values() if row["examples_per_s"] is not None]
        minutes = [
            f"{row['minutes']:.1f}{'*' if row['shared'] > 1 else ''}"
            for row in seeds.values()
            if row["minutes"] is not None
        ]
        cells = [
            task,
            attention,
            by_seed,
            _number(statistics.median(scores) if scores else None, "{:.3f}"),
            f"{min(scores):.3f}-{max(scores):.3f}" if scores else "-",
            ", ".join(f"{s}: {row['cell_top1']:.3f}" for s, row in seeds.items() if row["cell_top1"] is not None)
            or "-",
            ", ".join(
                f"{s}: {row['at_least_one_cell']:.3f}"
                for s, row in seeds.items()
                if row["at_least_one_cell"] is not None
            )
            or "-",
            baselines(folder, task),
            _number(statistics.median(speeds) if speeds else None, "{:.0f}"),
            ", ".join(minutes) or "-",
        ]
        lines.append(markdown_row(cells))
    settings = Path(folder) / "settings.txt"
    ran = f" Runs of {settings.read_text(encoding='utf-8').strip()}." if settings.is_file() else ""
    lanes = max((row["shared"] for seeds in found.values() for row in seeds.values()), default=1)
    shared = (
        f" Minutes marked * are a run's that shared the device with other runs (up to {lanes} at a time,"
        " LEARN_LANES, LEARN_SWEEP): its examples/s and minutes are a shared device's, not one run's alone."
        if lanes > 1
        else ""
    )
    by_question = [
        f"{task} {attention} seed {seed}: " + " / ".join(_number(value, "{:.3f}") for value in row["question_groups"])
        for (task, attention), seeds in found.items()
        for seed, row in seeds.items()
        if any(value is not None for value in row["question_groups"])
    ]
    questions = (
        f"\nQ1 / Q2 / Q3 / one cell / several ({', '.join(QUESTIONS + BY_ANSWER_SIZE)}: the first, second and third"
        " question of each sequence, then the questions whose answer is one cell and those whose answer is several,"
        f" the runs' own decoding): {'; '.join(by_question)}.\n"
        if by_question
        else ""
    )
    return "\n".join(lines) + (
        f"\n\n{METRIC} on each task's dev side; median and range over the complete runs; a run not complete shows"
        f" its last validation. Top cell: {TOP_CELL}, of the dev questions with an answer cell the share whose most"
        f" probable cell is one (no threshold). At least one cell: {AT_LEAST_ONE_CELL}, {METRIC} of the same weights"
        " decoded with model.head.at_least_one_cell=true, the most probable cell where none passes 0.5 (the runs' own"
        f" decoding is TAPAS's: the cells above 0.5).{shared}{ran}\n{questions}"
    )


if __name__ == "__main__":
    folder_main(table, __doc__)
