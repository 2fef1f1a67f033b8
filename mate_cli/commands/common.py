"""What every command shares: its Hydra app around :func:`mate_cli.run.job.run_task`, tables and metrics on screen,
loggers/callbacks from their config groups, a result file."""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Sequence

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.table import Table

from mate_cli.console import console, print_outputs
from mate_cli.io import atomic_write_json
from mate_cli.paths import CONF_DIR
from mate_cli.config.naming import register_resolvers
from mate_cli.run.job import run_dir, run_task
from mate_cli.silenced import silence

log = logging.getLogger("mate_cli")


def hydra_app(module: str, task: Callable[[DictConfig], object], objective: Callable | None = None):
    """Command ``module``'s entry point: Hydra on ``conf/<command>.yaml`` (the module's last name) running ``task``
    through :func:`run_task`; ``objective(cfg, result)``: what a sweeper optimises."""
    register_resolvers()

    def main(cfg: DictConfig):
        result = run_task(task, cfg)
        return objective(cfg, result) if objective else None

    main.__module__ = module  # Hydra names the job, and its <command>.log, after the entry point's module
    app = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=module.rpartition(".")[2])(main)
    app.task = task  # what the app runs, for callers that compose the config themselves (the tests)
    return app


def write_result(name: str, result: dict, **outputs) -> dict:
    """``result`` as ``<run dir>/<name>.json``, then the outputs on screen: the run dir, that file and ``outputs``."""
    path = atomic_write_json(run_dir() / f"{name}.json", result)
    print_outputs({"run dir": run_dir(), name: path, **outputs})
    return result


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*row)
    console().print(table)


def print_metrics(title: str, metrics: dict, names: Sequence[str], prefix: str = "") -> None:
    """One row of ``metrics[prefix + name]``, 4 decimals (a count, ``*questions``, as a whole number)."""
    shown = [f"{metrics[prefix + n]:.{0 if n.endswith('questions') else 4}f}" for n in names]
    print_table(title, names, [shown])


def first_results(results: list[dict]) -> dict[str, float]:
    return {k: float(v) for k, v in (results[0] if results else {}).items()}


def instantiate_dict(section: DictConfig | None) -> list:
    if not section:
        return []
    return [instantiate(conf) for conf in section.values() if isinstance(conf, DictConfig) and "_target_" in conf]


def quiet_third_party_logs() -> None:
    """Third-party progress bars and INFO logs off, :mod:`mate_cli.silenced`'s filters on."""
    silence()
    import datasets

    datasets.disable_progress_bars()
    for name in ("datasets", "transformers", "urllib3", "filelock", "fsspec"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Hydra's root handlers already print Lightning's records: drop Lightning's own handler to print each line once
    import lightning  # noqa: F401  (registers the handlers we remove)

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).handlers.clear()
