"""`mate report <multirun dir | outputs dir>`: each metric's median and half-IQR over seeds per configuration
(:mod:`mate_cli.report`), on screen and as ``report.md``, ``report.csv`` and ``report_*.<format>`` plots."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.markup import escape

from mate_cli.hydra_args import hydra_quote
from mate_cli.commands.common import hydra_app, run_dir
from mate_cli.errors import MateError
from mate_cli.console import console as screen_console
from mate_cli.console import print_outputs
from mate_cli.io import atomic_write_text
from mate_cli.report import aggregate, collect, render, screen


def report(cfg: DictConfig) -> list[aggregate.Configuration]:
    if OmegaConf.is_missing(cfg, "path") or cfg.path is None:
        raise MateError("path is missing; pass `mate report <multirun dir | outputs dir>` (or path=<dir>)")
    formats = [str(f) for f in cfg.get("formats") or ["png"]]
    unknown = [f for f in formats if f not in render.FORMATS]
    if unknown:
        raise MateError(
            f"formats={formats}: {', '.join(unknown)} is not a plot format; choose from {', '.join(render.FORMATS)}"
        )
    tasks = cfg.get("tasks")
    runs, skipped = collect.collect(str(cfg.path), None if tasks is None else list(tasks))
    configurations = aggregate.configurations(runs)
    requested = cfg.get("metrics")
    metrics = aggregate.choose_metrics(runs, None if requested is None else [str(m) for m in requested])
    main = aggregate.main_metric(metrics, cfg.get("main_metric"))
    metrics = aggregate.ordered(metrics, main)
    failed = collect.runs_with(runs, collect.FAILED_STATUS)
    incomplete = collect.runs_with(runs, collect.INCOMPLETE)

    columns, rows = render.table(configurations, metrics)
    title = f"{cfg.path}: median {render.PLUS_MINUS} half-IQR over seeds (main metric: {main or '-'})"
    console = screen_console()
    screen.print_tables(title, columns, rows, columns.index("runs") + 1, console, screen.screen_width())
    repeated = render.repeated_lines(configurations)
    for heading, lines in (
        ("repeated seeds, the newest finished run counted", repeated),
        ("failed runs", render.failed_lines(failed)),
        ("incomplete runs", render.incomplete_lines(incomplete)),
    ):
        if lines:
            console.print(f"[bold]{heading} ({len(lines)}):[/bold]")
            for line in lines:
                console.print(f"  {escape(line)}", soft_wrap=True)
    if skipped:
        console.print(
            f"[dim]left out {len(skipped)} run(s) of other tasks ({', '.join(sorted({str(r.task) for r in skipped}))})[/dim]"
        )

    out = run_dir()
    atomic_write_text(
        out / "report.md",
        render.markdown(
            str(cfg.path), columns, rows, main, failed, incomplete, skipped, render.repeated_lines(configurations, "`")
        ),
    )
    render.write_csv(configurations, metrics, out / "report.csv")
    plots = render.plot(configurations, metrics, main, out, formats) if cfg.get("plots", True) else []
    pattern = f"report_*.{formats[0]}" if len(formats) == 1 else f"report_*.{{{','.join(formats)}}}"
    print_outputs({"report dir": out, "table": out / "report.md", "numbers": out / "report.csv",
                   **({"plots": f"{out / pattern} ({len(plots)} files)"} if plots else {})})  # fmt: skip
    return configurations


#: Hydra flags followed by a value (``--info``'s is optional: one of INFO_VALUES)
VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
               "-cd", "--experimental-rerun")  # fmt: skip
INFO_VALUES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def path_argument(args: list[str]) -> list[str]:
    """The one bare argument (no ``=``, or an existing path such as a job dir ``0-attention=sat,seed=1``; not a flag or
    its value) -> ``path=<dir>``, quoted for Hydra."""
    bare = []
    for i, arg in enumerate(args):
        before = args[i - 1] if i else ""
        flag_value = before in VALUE_FLAGS or (before in ("--info", "-i") and arg in INFO_VALUES)
        if not arg.startswith("-") and not flag_value and ("=" not in arg or Path(arg).exists()):
            bare.append(i)
    if len(bare) > 1:
        raise MateError(
            f"mate report takes one folder, got {len(bare)}: {' '.join(args[i] for i in bare)}; pass one multirun or outputs dir"
        )
    return [f"path={hydra_quote(arg)}" if i in bare else arg for i, arg in enumerate(args)]


hydra_main = hydra_app(__name__, report)


def main() -> None:
    try:
        sys.argv[1:] = path_argument(sys.argv[1:])
    except MateError as err:
        print(f"mate: error: {err}", file=sys.stderr)
        sys.exit(MateError.exit_code)
    hydra_main()
