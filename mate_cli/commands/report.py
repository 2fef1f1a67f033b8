"""`mate report <multirun dir | outputs dir> [<dir> ...]`: each metric's median and half-IQR over seeds per
configuration, the runs of every folder pooled (:mod:`mate_cli.report`), on screen and as ``report.csv``,
``report_*.<format>`` plots and, last, ``report.md``: a report dir without it was stopped before the end."""

from __future__ import annotations

import sys

from omegaconf import DictConfig, OmegaConf
from rich.markup import escape

from mate_cli.config.hydra_args import path_argument
from mate_cli.commands.common import hydra_app
from mate_cli.run.job import run_dir
from mate_cli.errors import MateError
from mate_cli.console import console as screen_console
from mate_cli.console import print_outputs
from mate_cli.io import atomic_write_text
from mate_cli.report import aggregate, baselines, collect, render, rescored, screen


def folders(cfg: DictConfig) -> list[str]:
    """``path``: one folder, or a list of them."""
    given = None if OmegaConf.is_missing(cfg, "path") else cfg.path
    given = list(given) if OmegaConf.is_list(given) else [] if given is None else [given]
    if not given or any(folder is None or str(folder) == "" for folder in given):
        raise MateError(
            "path is missing; pass `mate report <multirun dir | outputs dir> [<dir> ...]` (or path=<dir>, "
            "path=[<dir>,<dir>])"
        )
    return [str(folder) for folder in given]


def report(cfg: DictConfig) -> list[aggregate.Configuration]:
    paths = folders(cfg)
    formats = [str(f) for f in cfg.get("formats") or ["png"]]
    if unknown := [f for f in formats if f not in render.FORMATS]:
        raise MateError(
            f"formats={formats}: {', '.join(unknown)} is not a plot format; choose from {', '.join(render.FORMATS)}"
        )
    tasks = cfg.get("tasks")
    runs, other = collect.collect(paths, None if tasks is None else list(tasks))
    beside = [run for run in other if run.task == collect.BASELINE]
    _, skipped = rescored.attach(runs, [run for run in other if run.task != collect.BASELINE])
    configurations = aggregate.configurations(runs)
    unmatched = baselines.attach(configurations, beside)
    requested = cfg.get("metrics")
    metrics = aggregate.choose_metrics(runs, None if requested is None else [str(m) for m in requested])
    main = aggregate.main_metric(metrics, cfg.get("main_metric"))
    metrics = aggregate.ordered(metrics, main)
    failed = collect.runs_with(runs, collect.FAILED_STATUS)
    incomplete = collect.runs_with(runs, collect.INCOMPLETE)

    columns, rows = render.table(configurations, metrics, main)
    title = f"{', '.join(paths)}: median {render.PLUS_MINUS} half-IQR over seeds (main metric: {main or '-'})"
    console = screen_console()
    screen.print_tables(title, columns, rows, columns.index("runs") + 1, console, screen.screen_width())
    for heading, lines in (
        ("repeated seeds, the newest finished run counted", render.repeated_lines(configurations)),
        ("failed runs", render.failed_lines(failed)),
        ("incomplete runs", render.incomplete_lines(incomplete)),
    ):
        if lines:
            console.print(f"[bold]{heading} ({len(lines)}):[/bold]")
            for line in lines:
                console.print(f"  {escape(line)}", soft_wrap=True)
    if skipped:
        others = ", ".join(sorted({str(r.task) for r in skipped}))
        console.print(f"[dim]left out {len(skipped)} run(s) of other tasks ({others})[/dim]")
    if unmatched:
        names = ", ".join(escape(run.name) for run in unmatched)
        console.print(f"[dim]{len(unmatched)} trivial baseline run(s) of data no row trained on: {names}[/dim]")

    out = run_dir()
    render.write_csv(configurations, metrics, out / "report.csv", main)
    plots = render.plot(configurations, metrics, main, out, formats) if cfg.get("plots", True) else []
    # last: a report.md in the folder says the report is whole (a report killed before it is run again into its dir)
    repeated = render.repeated_lines(configurations, "`")
    markdown = render.markdown(paths, columns, rows, main, failed, incomplete, skipped, repeated)
    atomic_write_text(out / "report.md", markdown)
    pattern = f"report_*.{formats[0]}" if len(formats) == 1 else f"report_*.{{{','.join(formats)}}}"
    print_outputs({"report dir": out, "table": out / "report.md", "numbers": out / "report.csv",
                   **({"plots": f"{out / pattern} ({len(plots)} files)"} if plots else {})})  # fmt: skip
    return configurations


hydra_main = hydra_app(__name__, report)


def main() -> None:
    try:
        sys.argv[1:] = path_argument(sys.argv[1:])
    except MateError as err:
        print(f"mate: error: {err}", file=sys.stderr)
        sys.exit(MateError.exit_code)
    hydra_main()
