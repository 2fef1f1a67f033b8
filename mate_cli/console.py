"""What mate prints: rich's layout on a terminal; in a file or pipe, lines never wrapped or cut (greppable paths)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Iterable

from omegaconf import DictConfig, OmegaConf

#: the width of output that is not a terminal: wide enough that nothing is wrapped or cut
UNWRAPPED = 10_000


def console():
    from rich.console import Console

    if sys.stdout.isatty():
        return Console(file=sys.stdout)
    return Console(file=sys.stdout, width=UNWRAPPED, soft_wrap=True, no_color=True, force_terminal=False)


def log_to_files(text: str, level: int = logging.INFO) -> None:
    """Write ``text`` into the run's log file(s) only (Hydra's ``<run dir>/<task>.log``), not the screen."""
    record = logging.LogRecord("mate_cli", level, __file__, 0, "%s", (text,), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def print_config(cfg: DictConfig, overrides: Iterable[str], out: Path, whole: bool = False) -> None:
    """The start of a run: on screen, the overrides and run dir (``whole``: the config as a tree too); in the run's
    log file, the whole resolved config."""
    text = OmegaConf.to_yaml(cfg, resolve=True)
    log_to_files("config (resolved):\n" + text)
    screen = console()
    if whole:
        import rich.syntax
        import rich.tree

        tree = rich.tree.Tree("CONFIG", guide_style="dim")
        order = ("dataset", "model", "attention", "hardware")
        for key in [k for k in order if k in cfg] + [k for k in cfg if k not in order]:
            value = cfg[key]
            branch = tree.add(str(key), guide_style="dim")
            shown = OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig) else str(value)
            branch.add(rich.syntax.Syntax(shown, "yaml", theme="ansi_dark"))
        screen.print(tree)
    overrides = [str(o) for o in overrides]
    lines = [f"overrides: {' '.join(overrides) if overrides else '(none: the defaults)'}", f"run dir:   {out}"]
    if not whole:
        lines.append("config:    resolved_config.yaml in the run dir (extras.print_config=true prints it here)")
    for line in lines:
        screen.print(line, markup=False, highlight=False)


def print_outputs(outputs: dict[str, object]) -> None:
    """The last lines of a command: ``name: path`` for each output it wrote (never wrapped)."""
    width = max((len(name) for name in outputs), default=0) + 1
    for name, path in outputs.items():
        print(f"{name + ':':<{width}} {path}")
