"""The table of ``tools/e2e.sh``: ``python -m mate_cli.bench.e2e <folder>`` reads each ``<task>_<attention>/`` run dir's
``step_profile.json`` (:mod:`mate_cli.callbacks.step_profile`) and prints one Markdown row per run, with MATE's
examples/s over dense's for each task."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLUMNS = (
    ("examples/s", "examples_per_s", "{:.1f}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("ms a step", "ms_per_step", "{:.1f}"),
    ("between steps ms", "ms_between_steps", "{:.1f}"),
    ("in the step (host) ms", "ms_in_step_host", "{:.1f}"),
    ("GPU busy", "gpu_busy_share", "{:.0%}"),
    ("host syncs a step", "host_syncs_per_step", "{:g}"),
    ("on logging steps", "host_syncs_per_logging_step", "{:g}"),
    ("padding", "padding_share", "{:.0%}"),
    ("peak MB", "peak_mem_mb", "{:,.0f}"),
)


def rows(folder: Path) -> list[tuple[str, str, dict]]:
    """``(task, attention, profile)`` per run dir ``<task>_<attention>`` that has a ``step_profile.json``."""
    found = []
    for path in sorted(Path(folder).glob("*/step_profile.json")):
        task, _, attention = path.parent.name.rpartition("_")
        found.append((task, attention, json.loads(path.read_text())))
    return found


def table(folder: Path) -> str:
    runs = rows(folder)
    header = ["task", "attention", *(name for name, _, _ in COLUMNS), "MATE / dense"]
    lines = [markdown_row(header), "|" + "---|" * 2 + "---:|" * (len(header) - 2)]
    dense = {task: p.get("examples_per_s") for task, attention, p in runs if attention == "dense"}
    for task, attention, profile in runs:
        values = ("-" if profile.get(key) is None else form.format(profile[key]) for _, key, form in COLUMNS)
        cells = [task, attention, *values]
        base, mine = dense.get(task), profile.get("examples_per_s")
        cells.append(f"{mine / base:.2f}x" if attention != "dense" and base and mine else "")
        lines.append(markdown_row(cells))
    device = next((p.get("device") for _, _, p in runs), "?")
    steps = next((p.get("steps_timed") for _, _, p in runs), "?")
    return "\n".join(lines) + f"\n\nDevice {device}; {steps} steps timed after 10 warm-up steps, as many watched.\n"


def markdown_row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def folder_main(table_of, doc: str) -> None:
    """``python -m <module> <folder>``: prints ``table_of(folder)`` (the table of tools/e2e.sh)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("folder", type=Path)
    print(table_of(parser.parse_args().folder), end="")


if __name__ == "__main__":
    folder_main(table, __doc__)
