"""The run dirs (folders holding ``resolved_config.yaml`` or ``.hydra/``) under one folder or several, read.

A run is ``failed`` when it holds ``FAILED`` (its first line is the reason), a file that cannot be read, or a
``metrics.json`` with a non-finite number (it diverged); ``ok`` when it holds ``metrics.json``; ``incomplete`` otherwise
(killed, or still running), and ``cut`` among those when it kept ``checkpoints/last.ckpt`` (a budget or a signal
stopped it: running it again continues it). Its configuration is ``resolved_config.yaml``, else (a run that died
before writing it) ``.hydra/config.yaml``. A run dir that lost ``.hydra/hydra.yaml`` (its group choices: which
dataset, which attention) takes each choice from the runs beside it whose config holds the same settings under that
group (:func:`recover_choices`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from mate_cli.callbacks.divergence import non_finite_metrics
from mate_cli.errors import MateError
from mate_cli.config.yaml_data import read_yaml

RESOLVED = "resolved_config.yaml"
METRICS = "metrics.json"
CSV_LOG = Path("csv") / "metrics.csv"
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
HYDRA_DIR = ".hydra"
#: what a failed run's dir holds (mate_cli.run.job.FAILED_MARKER)
FAILED = "FAILED"

OK, FAILED_STATUS, INCOMPLETE = "ok", "failed", "incomplete"
#: `mate baseline`'s task: the trivial baselines (:mod:`mate_cli.report.baselines`)
BASELINE = "baseline"
#: the tasks whose runs are read beside the rows, no rows themselves unless ``tasks`` names them
BESIDE = (BASELINE,)

_CHOICE = re.compile(r"\$\{hydra:runtime\.choices\.([\w/.]+)\}")


@dataclass
class Run:
    path: Path
    name: str  # the path relative to its folder (several folders: after the folder's name)
    status: str = INCOMPLETE
    config: dict = field(default_factory=dict)
    choices: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    error: str = ""
    texts: dict = field(default_factory=dict)  # metrics.json's text values (a baseline's rule)
    finished: float = 0.0  # when metrics.json was written (seconds since the epoch)
    choices_lost: bool = False  # its resolved config is there, its .hydra/hydra.yaml (the group choices) is not
    cut: bool = False  # incomplete, with its checkpoints/last.ckpt: stopped by a budget or a signal, to be continued

    @property
    def task(self) -> str | None:
        task = self.config.get("task_name")
        return None if task is None else str(task)

    @property
    def mark(self) -> str:
        """How a run without a result ended, as the per-seed lists say it: ``failed``, ``cut`` or ``incomplete``."""
        return FAILED_STATUS if self.status == FAILED_STATUS else "cut" if self.cut else INCOMPLETE

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    def setting(self, dotted: str) -> Any:
        return lookup(self.config, dotted)


def lookup(node: Any, dotted: str) -> Any:
    """The value at ``dotted`` in a plain config, else None."""
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def find_run_dirs(root: Path) -> list[Path]:
    """The run dirs under ``root`` (included), not searching a run dir's subfolders or hidden folders."""
    found = []
    for folder, dirs, files in os.walk(root):
        if RESOLVED in files or HYDRA_DIR in dirs:
            found.append(Path(folder))
            dirs[:] = []
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(found)


def _yaml(path: Path) -> Any:
    return read_yaml(path, "it is not a run dir mate wrote", interpolations=True)


def composed_setting(run: Run, dotted: str) -> Any:
    """``dotted`` in the run's ``.hydra/config.yaml``, as composed (interpolations unresolved); None where absent or
    unreadable."""
    try:
        return lookup(_yaml(run.path / HYDRA_DIR / "config.yaml"), dotted)
    except MateError:
        return None


def _fill_choices(value: Any, choices: dict) -> Any:
    """``${hydra:runtime.choices.X}`` in an unresolved ``.hydra/config.yaml`` -> the choice."""
    if isinstance(value, dict):
        return {k: _fill_choices(v, choices) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_choices(v, choices) for v in value]
    if isinstance(value, str):
        return _CHOICE.sub(lambda m: str(choices.get(m.group(1), m.group(0))), value)
    return value


def parse_overrides(lines: Iterable[str]) -> dict[str, str]:
    """``["+sweep=x", "attention=sat", "seed=1"]`` -> ``{"sweep": "x", "attention": "sat", "seed": "1"}``."""
    parts = [str(line).partition("=") for line in lines]
    return {key.lstrip("+~"): value for key, sep, value in parts if sep}


def numeric_metrics(data: dict) -> dict[str, float]:
    return {
        str(k): float(v) for k, v in data.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }  # fmt: skip


def logged_rows(path: Path) -> list[dict[str, str]]:
    log = path / CSV_LOG
    if not log.is_file():
        return []
    with open(log, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def last_validation(path: Path) -> dict[str, float]:
    """The ``val/*`` values of the CSV log's last validation: for a ``metrics.json`` without them (older
    ``validate_best=false`` runs)."""
    last: dict[str, float] = {}
    for row in logged_rows(path):
        values = {k: float(v) for k, v in row.items() if k and k.startswith("val/") and v not in (None, "")}
        last.update(numeric_metrics(values))
    return last


def _first_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[0] if lines else "(FAILED is empty)"


def load_run(path: Path, root: Path) -> Run:
    """One run dir; a file that cannot be read makes it ``failed`` with that reason."""
    name = path.relative_to(root).as_posix() if path != root else path.name
    run = Run(path=path, name=name)
    hydra_dir = path / HYDRA_DIR
    current = None
    try:
        if (current := hydra_dir / "hydra.yaml").is_file():
            choices = ((_yaml(current) or {}).get("hydra") or {}).get("runtime", {}).get("choices") or {}
            run.choices = {str(k): v for k, v in choices.items() if v is not None}
        if (current := hydra_dir / "overrides.yaml").is_file():
            run.overrides = parse_overrides(_yaml(current) or [])
        if (current := path / RESOLVED).is_file():
            run.config = _yaml(current) or {}
            run.choices_lost = not (hydra_dir / "hydra.yaml").is_file()
        elif (current := hydra_dir / "config.yaml").is_file():
            run.config = _fill_choices(_yaml(current) or {}, run.choices)
        current = None
        if (path / FAILED).is_file():
            run.status, run.error = FAILED_STATUS, _first_line(path / FAILED)
        elif (current := path / METRICS).is_file():
            data = json.loads(current.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            run.status, run.metrics, run.finished = OK, numeric_metrics(data), current.stat().st_mtime
            run.texts = {str(k): v for k, v in data.items() if isinstance(v, str)}
            if bad := non_finite_metrics(data):  # a diverged run: no result, whatever its accuracy reads
                run.status, run.error = FAILED_STATUS, f"non-finite metrics ({', '.join(bad)}): the run diverged"
            if not any(k.startswith("val/") for k in run.metrics):  # validate_best=false, before it wrote them
                current = path / CSV_LOG
                run.metrics.update(last_validation(path))
    except Exception as err:  # noqa: BLE001 - an unreadable run is listed as failed, not fatal
        where = current.relative_to(path).as_posix() if current is not None else "run dir"
        run.status, run.error = FAILED_STATUS, " ".join(f"unreadable {where}: {type(err).__name__}: {err}".split())
    if not isinstance(run.config, dict):
        run.config = {}
    run.cut = run.status == INCOMPLETE and (path / LAST_CHECKPOINT).is_file()
    return run


def folder_labels(roots: Sequence[Path]) -> list[str]:
    """What prefixes the names of each folder's runs: nothing for one folder; for several, each folder's name, or (two
    of them named alike) the folder as given."""
    if len(roots) < 2:
        return [""]
    names = [root.resolve().name or str(root) for root in roots]
    return names if len(set(names)) == len(names) else [str(root) for root in roots]


def load_runs(roots: Sequence[Path]) -> list[Run]:
    """Every run dir under each folder, once (folders inside one another), named relative to its folder (several: the
    folder's label first)."""
    runs, seen = [], set()
    for root, label in zip(roots, folder_labels(roots)):
        for folder in find_run_dirs(root):
            if (where := folder.resolve()) in seen:
                continue
            seen.add(where)
            run = load_run(folder, root)
            if label:
                run.name = label if folder == root else f"{label}/{run.name}"
            runs.append(run)
    return runs


def collect(path: str | os.PathLike | Sequence[str | os.PathLike],
            tasks: Iterable[str] | None = ("train",)) -> tuple[list[Run], list[Run]]:  # fmt: skip
    """``(runs of tasks, runs of other tasks)`` under ``path``, one folder or several pooled (``tasks`` None: all
    but :data:`BESIDE`'s; a run without a task is kept), reports left out (this one too, when written into ``path``)."""
    hint = "pass a multirun dir (outputs/multirun/train/<time>) or an outputs dir"
    given = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    roots = [Path(folder).expanduser() for folder in given]
    for folder, root in zip(given, roots):
        if not root.exists():
            raise MateError(f"path={folder} does not exist; {hint}")
        if not root.is_dir():
            raise MateError(f"path={folder} is not a directory; {hint}")
    runs = [run for run in load_runs(roots) if run.task != "report"]
    recover_choices(runs)
    wanted = None if tasks is None else {str(t) for t in tasks}
    keep = [r.task is None or (r.task not in BESIDE if wanted is None else r.task in wanted) for r in runs]
    kept = [r for r, k in zip(runs, keep) if k]
    other = [r for r, k in zip(runs, keep) if not k]
    if not kept:
        others = sorted({str(r.task) for r in other})
        seen = f" (only runs of {', '.join(others)})" if others else " (no folder with resolved_config.yaml or .hydra/)"
        label = "/".join(sorted(wanted)) + " " if wanted else ""
        raise MateError(f"no {label}runs under {', '.join(map(str, given))}{seen}; {hint}")
    return kept, other


def recover_choices(runs: list[Run]) -> None:
    """Each group choice a run dir lost with its ``.hydra/hydra.yaml``, from the other runs: the one choice of the runs
    whose config holds the same settings under that group (``dataset``, ``attention``, ...) as its resolved config.
    A choice no run matches stays unknown (:func:`mate_cli.report.aggregate.configurations` then lists the run as
    unreadable)."""
    known = [run for run in runs if run.choices and not run.choices_lost]
    for run in (run for run in runs if run.choices_lost):
        for group in sorted({group for other in known for group in other.choices} - set(run.choices)):
            settings = run.setting(group)
            if not isinstance(settings, dict):  # a group without a node of its own (experiment, hydra/launcher)
                continue
            names = {str(other.choices[group]) for other in known if group in other.choices
                     and other.setting(group) == settings}  # fmt: skip
            if len(names) == 1:
                run.choices[group] = names.pop()


def runs_with(runs: Iterable[Run], status: str) -> list[Run]:
    return [r for r in runs if r.status == status]
