"""Stages chained by matching jobs: ``init_from=sweep:<dir>`` (or ``model.encoder.pretrained=sweep:<dir>`` for a
``mate pretrain`` sweep) starts each job from the run in ``<dir>`` that matches it.

The keys that match are those the earlier sweep varied (their values differ between its jobs: ``attention``, ``seed``,
...) and that this job's overrides set too: a WikiTQ sweep ``attention=mate,dense seed=1,2`` started from an SQA
sweep of the same attentions and seeds takes, for each job, the SQA run of its attention and seed. Zero or several
matching runs, or a match that has not finished (no ``metrics.json``), is one line naming them. The value is replaced
by the run found (``init_from``: its run dir; ``pretrained``: its ``encoder/``) before the run records its config, so
``resolved_config.yaml`` (and ``metrics.json``'s ``started_from``) say which run it started from.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from mate_cli.errors import MateError
from mate_cli.config.yaml_data import read_yaml

log = logging.getLogger(__name__)

PREFIX = "sweep:"
#: the keys that may name an earlier sweep, and what of the matching run they take (None: the run dir)
KEYS = {"init_from": None, "model.encoder.pretrained": "encoder"}


def resolve_earlier_stage(cfg: DictConfig) -> None:
    """Each ``sweep:<dir>`` value of :data:`KEYS` in ``cfg`` replaced by the matching run's folder."""
    for key, inner in KEYS.items():
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, str) and value.startswith(PREFIX):
            run = matching_run(value, key, job_values(cfg))
            found = run / inner if inner else run
            if inner and not (found / "config.json").is_file():
                raise MateError(
                    f"{key}={value}: the matching run {run} has no {inner}/ (a `mate pretrain` run exports it at its "
                    "end); point it at a sweep of `mate pretrain`"
                )
            with open_dict(cfg):
                OmegaConf.update(cfg, key, str(found))
            log.info("%s=%s: this job starts from %s", key, value, found)


def job_values(cfg: DictConfig) -> dict[str, str]:
    """This job's overrides (command line and sweep) as ``{key: value}``."""
    from mate_cli.run.job import command_overrides

    return overrides_dict(command_overrides())


def overrides_dict(overrides) -> dict[str, str]:
    """``["+seed=1", "++trainer.max_steps=2", "attention='mate'"]`` -> ``{"seed": "1", ...}``, quotes undone."""
    found = {}
    for item in overrides or ():
        key, sep, value = str(item).partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if sep:
            found[key.lstrip("+~")] = value
    return found


def sweep_jobs(folder: Path) -> dict[Path, dict[str, str]]:
    """The job folders of the sweep in ``folder`` with their overrides (``.hydra/overrides.yaml``)."""
    jobs = {}
    for job in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        recorded = job / ".hydra" / "overrides.yaml"
        if recorded.is_file():
            overrides = read_yaml(recorded, "run that sweep again", interpolations=True)
            jobs[job] = overrides_dict(overrides if isinstance(overrides, list) else [])
    return jobs


def matching_run(value: str, key: str, mine: dict[str, str]) -> Path:
    """The run of the sweep ``value`` names (``sweep:<dir>``) that matches this job's overrides ``mine``."""
    folder = Path(value[len(PREFIX) :]).expanduser().resolve()
    if not folder.is_dir():
        raise MateError(f"{key}={value}: {folder} is no folder; name the hydra.sweep.dir of the earlier sweep")
    jobs = sweep_jobs(folder)
    if not jobs:
        raise MateError(
            f"{key}={value}: {folder} holds no sweep's jobs (no <job>/.hydra/overrides.yaml); name the "
            "hydra.sweep.dir of the earlier sweep"
        )
    varied = sorted({k for job in jobs.values() for k in job if len({j.get(k) for j in jobs.values()}) > 1})
    shared = [k for k in varied if k in mine]
    wanted = ", ".join(f"{k}={mine[k]}" for k in shared) or "no key both sweeps vary"
    matches = [job for job, values in jobs.items() if all(values.get(k) == mine[k] for k in shared)]
    if not matches:
        ran = "; ".join(f"{k} in {sorted({str(j.get(k)) for j in jobs.values()})}" for k in shared)
        raise MateError(f"{key}={value}: no job of {folder} has {wanted} (its jobs ran {ran}); sweep the same values")
    if len(matches) > 1:
        names = ", ".join(job.name for job in matches[:4]) + (" ..." if len(matches) > 4 else "")
        apart = [k for k in varied if k not in mine]
        raise MateError(
            f"{key}={value}: {len(matches)} jobs of {folder} match {wanted} ({names}); they differ in "
            f"{', '.join(apart)}: set {' and '.join(apart)} in this sweep too"
        )
    run = matches[0]
    if not (run / "metrics.json").is_file():
        failed = run / "FAILED"
        why = f"it failed: {failed.read_text(encoding='utf-8', errors='replace').strip()}" if failed.is_file() else (
            "it was cut or has not run")  # fmt: skip
        raise MateError(
            f"{key}={value}: the matching job {run} has not finished (no metrics.json; {why}); run that sweep again "
            "to finish it first"
        )
    return run
