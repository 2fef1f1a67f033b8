"""`mate bench`: run the grid of ``bench.*`` (:mod:`mate_cli.bench`) and write into the run dir ``bench.csv`` (a row
per level x mode x backend x length), ``bench.md``, ``targets.json``, ``bench_<level>_<mode>.png``, ``machine.json``
and ``resolved_config.yaml``."""

from __future__ import annotations

import dataclasses
import os

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mate_cli.bench import results, runner, targets
from mate_cli.bench.layouts import TableShape
from mate_cli.bench.cases import LEVELS
from mate_cli.bench.runner import Settings
from mate_cli.commands.common import hydra_app, quiet_third_party_logs
from mate_cli.run.job import run_dir
from mate_cli.console import print_outputs
from mate_cli.io import atomic_write_json, atomic_write_text


def settings_from(b: dict) -> Settings:
    """The runner's settings from the resolved ``bench.*`` (each level's backend lists from ``bench.<level>``)."""
    values = {f.name: b[f.name] for f in dataclasses.fields(Settings) if f.name in b}
    for key in ("backends", "linear_backends"):
        values[key] = {level: list((b.get(level) or {}).get(key) or []) for level in LEVELS}
    values.update(linear_lengths=b.get("linear_lengths") or [], max_length=b.get("max_length") or {})
    return Settings(**values | {"table": TableShape(**b["table"])})


def bench(cfg: DictConfig) -> list[dict]:
    """Returns the rows of ``bench.csv``."""
    quiet_third_party_logs()
    out = run_dir()
    atomic_write_text(out / "resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    b = OmegaConf.to_container(cfg.bench, resolve=True)
    settings = settings_from(b)
    settings.check()
    specs = targets.parse(b.get("targets"))  # checked before the grid
    console = Console()
    machine = runner.machine(settings)  # before the grid: its load average is other processes'
    cells = settings.cells()
    rows: list[dict] = []
    with Progress(
        TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=console, disable=not b.get("progress", True),
    ) as progress:  # fmt: skip
        task = progress.add_task("", total=len(cells))

        def on_cell(row: dict) -> None:
            rows.append(row)
            results.write_csv(rows, out / "bench.csv")  # partial results survive an interrupt
            cell = f"{row['level']}/{row['mode']} {row['backend']} {row['seq_len']}: {row['status']}"
            progress.update(task, advance=1, description=cell)

        runner.run_grid(settings, on_cell=on_cell)
    machine["load_avg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    atomic_write_json(out / "machine.json", machine)
    results.write_csv(rows, out / "bench.csv")
    results.print_tables(rows, console)
    checked = targets.evaluate(rows, specs)
    targets.print_targets(checked, console)
    atomic_write_json(out / "targets.json", [dataclasses.asdict(t) for t in checked])
    atomic_write_text(out / "bench.md", results.markdown(rows, checked, machine))
    if b.get("plots", True):
        results.plot(rows, out)
    print_outputs({"run dir": out, "results": out / "bench.csv", "tables": out / "bench.md",
                   "targets": out / "targets.json",
                   **({"plots": out / "*.png"} if b.get("plots", True) else {})})  # fmt: skip
    return rows


main = hydra_app(__name__, bench)
