"""`mate <command> <overrides>` in the test process: the checks `mate_cli.cli.main` makes of
the command line, real Hydra composition of ``conf/<command>.yaml`` (its compose API), the
run dir set up as Hydra's run sets it up (``.hydra/``, ``<command>.log``), then the very
task function the command's Hydra app hands to ``run_task``.

What stays with the real process (tests start `mate` for it): the exit status and the
screen of the entry point, ``FAILED`` and the run-dir lock of ``run_task``, signals,
multirun launchers, DDP ranks.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from mate_cli.errors import MateError
from mate_cli.paths import CONF_DIR
from mate_cli.config.naming import register_resolvers

#: Hydra's own job log format (hydra/job_logging/default.yaml)
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def command_line(command: str, overrides: list[str]) -> list[str]:
    """The overrides Hydra composes for ``mate <command> <overrides>``, after the checks and
    rewrites `mate_cli.cli.main` makes; a problem it prints as one line raises `MateError`."""
    from mate_cli.cli import checked_command_line
    from mate_cli.config.check import trainer_overrides

    args, problem = checked_command_line(command, overrides)
    if problem:
        raise MateError(problem)
    return trainer_overrides(command, args)


@contextmanager
def hydra_compose():
    """Hydra's compose API over ``conf/`` (one initialisation for many composes), cleared after."""
    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            yield compose
    finally:
        GlobalHydra.instance().clear()


def compose_command(
    command: str, overrides: list[str], run_dir: Path | None = None, checked: bool = False
) -> DictConfig:
    """``mate <command> <overrides>``'s config with its ``hydra`` node, the Hydra runtime set
    as in a real run into ``run_dir`` (None: the run dir the config names; ``checked``: through
    :func:`command_line` first)."""
    args = command_line(command, overrides) if checked else list(overrides)
    if run_dir is not None:
        args.append(f"hydra.run.dir={run_dir}")
    with hydra_compose() as compose_:
        cfg = compose_(command, overrides=args, return_hydra_config=True)
    if run_dir is not None:
        cfg.hydra.runtime.output_dir = str(run_dir)
    HydraConfig.instance().set_config(cfg)
    return cfg


def build(cfg: DictConfig, tmp_path: Path):
    """Datamodule, model and trainer of a composed training config (loggers and callbacks too)."""
    import lightning as L
    from hydra.utils import instantiate

    datamodule = instantiate(cfg.dataset, cache_dir=str(tmp_path / "cache"))
    model = instantiate(cfg.model)
    callbacks = [instantiate(c) for c in cfg.callbacks.values()]
    trainer = L.Trainer(**OmegaConf.to_container(cfg.trainer, resolve=True), callbacks=callbacks, logger=False)
    return datamodule, model, trainer


def run_command(command: str, overrides: list[str], run_dir: Path):
    """Run ``mate <command> <overrides>`` in this process into ``run_dir``; returns what the
    task returns (train: its metrics). A user error raises `MateError`, as the task raises it."""
    cfg = compose_command(command, overrides, Path(run_dir), checked=True)
    from mate_cli.cli import COMMANDS

    task = getattr(importlib.import_module(COMMANDS[command][0]), APPS.get(command, "main")).task
    with job(cfg, command, Path(run_dir)):
        try:
            return task(cfg)
        except Exception as err:  # the one line run_task prints: the MateError anywhere in the chain
            from mate_cli.run.job import find_mate_error

            user_error = find_mate_error(err)
            if user_error is None or user_error is err:
                raise
            raise user_error from err


def run_app(command: str, overrides: list[str], run_dir: Path) -> tuple[int, str]:
    """The function of ``mate <command>``'s Hydra app (the one that hands the task to
    ``run_task``, which takes the run-dir lock, writes ``FAILED`` and ends a user error with
    one line and exit status 2) on the composed config, in this process: its exit status and
    stderr. What ``run_task`` changes in the process (signal handlers, W&B's folders in the
    environment, the run-dir lock, a signal it received) is put back."""
    import os
    import signal

    from mate_cli.callbacks import interrupts
    from mate_cli.run import lock as run_lock
    from mate_cli.cli import COMMANDS

    cfg = compose_command(command, overrides, Path(run_dir), checked=True)
    app = getattr(importlib.import_module(COMMANDS[command][0]), APPS.get(command, "main")).__wrapped__
    handlers = {signum: signal.getsignal(signum) for signum in interrupts.SIGNALS}
    environ = dict(os.environ)
    err, code = StringIO(), 0
    try:
        with job(cfg, command, Path(run_dir)), redirect_stderr(err):
            app(cfg)
    except SystemExit as end:
        code = end.code
    finally:
        interrupts.install()  # forgets a signal the command received, which would stop the next training at once
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        os.environ.clear()
        os.environ.update(environ)
        run_lock.release(run_dir)
    return code, err.getvalue()


#: the name of the Hydra app in a command's module, where it is not ``main``
APPS = {"report": "hydra_main"}


@contextmanager
def job(cfg: DictConfig, command: str, run_dir: Path):
    """What Hydra's run sets up around a job, for the task run inside: ``.hydra/``, the config
    without its ``hydra`` node (HydraConfig holds it), and Hydra's job logging (the run's log
    file, and the screen: stdout as it is now, capsys's or redirect_stdout's)."""
    save_hydra_files(cfg, run_dir)
    with open_dict(cfg):
        del cfg["hydra"]
    handlers = [logging.FileHandler(run_dir / f"{command}.log"), logging.StreamHandler(sys.stdout)]
    root = logging.getLogger()
    level = root.level
    for handler in handlers:
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)
        HydraConfig.instance().cfg = None


def run_captured(command: str, overrides: list[str], run_dir: Path) -> subprocess.CompletedProcess:
    """:func:`run_command` with what it shows: stdout (prints and log lines, as Hydra's job
    logging puts them on the screen), stderr, and the exit status `mate` would give: 0, or 2
    with the one ``mate: error:`` line of a user error (that `mate` does this as a process
    is tested in tests/integration/test_cli.py)."""
    out, err = StringIO(), StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            run_command(command, overrides, run_dir)
        except MateError as error:
            print(f"mate: error: {error}", file=sys.stderr)
            code = MateError.exit_code
    return subprocess.CompletedProcess([command, *overrides], code, out.getvalue(), err.getvalue())


def save_hydra_files(cfg: DictConfig, run_dir: Path) -> None:
    """``<run dir>/.hydra/{config,hydra,overrides}.yaml`` as Hydra's run writes them."""
    folder = run_dir / str(cfg.hydra.output_subdir)
    folder.mkdir(parents=True, exist_ok=True)
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    OmegaConf.save(task, folder / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": cfg.hydra}), folder / "hydra.yaml")
    OmegaConf.save(OmegaConf.create(list(cfg.hydra.overrides.task)), folder / "overrides.yaml")


def main_before_hydra(argv: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    """`mate <argv>`'s entry point (:func:`mate_cli.cli.main`) in this process, for what it
    answers before Hydra's app starts (help, one-line checks of the command line): its
    exit status, stdout and stderr. Reaching Hydra's app fails the test: these answers
    come before anything is composed, built or written."""
    from mate_cli import cli

    def reached(app, program, command, args):
        raise AssertionError(f"`mate {' '.join(argv)}` reached Hydra's app: its check did not answer first")

    monkeypatch.setattr(cli, "run_hydra_app", reached)
    capsys.readouterr()
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
