"""`mate eval ckpt_path=<run dir | checkpoint | TAPAS task directory>`: rebuild that run (:mod:`mate_cli.run.rebuild`;
a transformers task directory: :mod:`mate_cli.run.task_directory`), evaluate
``split``, write ``metrics.json`` (with the ``overrides`` that changed the run's config, if any) and, for a table
task, the predictions in the dataset's upstream answer format. ``tables=shuffled`` (TabFact) scores each statement
against another table of the split (:mod:`mate_cli.data.other_tables`)."""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from mate_cli.commands.common import first_results, hydra_app, log, print_metrics, quiet_third_party_logs, write_result
from mate_cli.run.job import run_dir
from mate_cli.callbacks.divergence import non_finite_metrics
from mate_cli.data.other_tables import EVAL_TABLES
from mate_cli.errors import MateError, check_choice
from mate_cli.callbacks.interrupts import cluster_plugins
from mate_cli.run.resume import AtomicCheckpointIO
from mate_cli.run.rebuild import check_checkpoint_fits, dataset_here, load_run_config, run_checkpoint
from mate_cli.run.task_directory import check_head_loaded, describe, task_directory, task_run_config, weights_digest
from mate_cli.config.schema import check_trainer_args


SPLIT_PREFIX = {"validation": "val", "test": "test"}


def read_checkpoint_once(path: str, model) -> tuple[dict, str]:
    """The checked checkpoint at ``path`` and the first 16 hex digits of its file's SHA-256; refused in one line when
    the file changed while it was read (a `mate train` of that run writing it)."""
    before = os.stat(path)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    checkpoint = check_checkpoint_fits(path, model, "ckpt_path")
    after = os.stat(path)
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise MateError(
            f"ckpt_path={path} changed while it was read (a run is writing it); evaluate again once it is written, "
            "or evaluate a finished run"
        )
    return checkpoint, digest.hexdigest()[:16]


def evaluate(cfg: DictConfig) -> dict[str, float]:
    quiet_third_party_logs()
    if OmegaConf.is_missing(cfg, "ckpt_path") or cfg.ckpt_path is None:
        raise MateError(
            "ckpt_path is missing; pass ckpt_path=<run dir> (its best checkpoint) or <run dir>/checkpoints/<name>.ckpt"
        )
    if cfg.split not in SPLIT_PREFIX:
        raise MateError(f"split={cfg.split!r} is invalid; use split=validation or split=test")
    trainer_args = check_trainer_args(OmegaConf.to_container(cfg.trainer, resolve=True))
    directory = task_directory(cfg.ckpt_path)
    if directory is not None:  # a transformers TAPAS task directory, scored as it is
        log.info("ckpt_path=%s: %s", cfg.ckpt_path, describe(directory))
        ckpt_path, train_cfg = None, task_run_config(directory, cfg.get("overrides") or [], cfg.paths)
        source = directory.resolved
    else:
        ckpt_path = source = str(run_checkpoint(cfg.ckpt_path))
        if ckpt_path != str(cfg.ckpt_path):
            log.info("ckpt_path=%s: evaluating %s", cfg.ckpt_path, ckpt_path)
        train_cfg = load_run_config(ckpt_path, cfg.get("overrides"), bool(cfg.get("trust_run_config")))
    tables = cfg.get("tables", "own")
    check_choice("tables", tables, EVAL_TABLES)
    if train_cfg.dataset.get("task") == "tabfact":  # `tables` decides, whatever the run or `overrides` set
        with open_dict(train_cfg.dataset):
            train_cfg.dataset.eval_tables = tables
    elif tables != "own":
        raise MateError(
            f"tables={tables} pairs each TabFact statement with another table; {source} is a model of "
            f"dataset={train_cfg.dataset.get('task') or 'hybridqa'}: evaluate it with tables=own"
        )
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(dataset_here(train_cfg, cfg.paths.cache_dir))
    model = instantiate(train_cfg.model)
    if directory is not None:
        check_head_loaded(directory, model)
        checkpoint, digest = {}, weights_digest(directory)
    else:
        checkpoint, digest = read_checkpoint_once(ckpt_path, model)
    questions = datamodule.questions(cfg.split) if hasattr(datamodule, "questions") else None
    if questions is not None and not any(q.answered for q in questions):
        source = f"{datamodule.eval_file} in {datamodule.root}" if datamodule.eval_file else datamodule.root
        fix = "evaluate split=validation, or write test predictions with `mate pointr split=test` (HybridQA)"
        if datamodule.eval_file:
            fix = "name a question file with answers: \"overrides=['dataset.eval_file=<file>']\""
        raise MateError(
            f"split={cfg.split}: none of the {len(questions)} questions of {source} has an answer to score "
            f"(a released test file has none); {fix}"
        )
    trainer_args.setdefault("default_root_dir", str(run_dir()))  # Lightning's own files stay in the run dir
    trainer_args.setdefault("plugins", cluster_plugins())  # signals are mate's (mate_cli.callbacks.interrupts)
    if ckpt_path is not None:
        checkpoint_io = AtomicCheckpointIO()  # Lightning evaluates the state checked above, not a newer write of it
        checkpoint_io.preload(ckpt_path, checkpoint)
        trainer_args["plugins"] = [*trainer_args.get("plugins", []), checkpoint_io]
    trainer = L.Trainer(**trainer_args)
    if getattr(datamodule, "task", None) and trainer.world_size > 1:
        raise MateError(
            f"mate eval of a {datamodule.task.name} run writes one predictions file and (SQA) feeds each "
            "question the previous prediction: run it on one device (hardware=cpu or hardware=gpu)"
        )
    run = trainer.validate if cfg.split == "validation" else trainer.test
    with warnings.catch_warnings():
        # the checkpoint's training callbacks keep state only training needs: evaluation loses nothing
        warnings.filterwarnings("ignore", message=r"Be aware that when using `ckpt_path`, callbacks used to create")
        results = run(model, datamodule=datamodule, ckpt_path=ckpt_path, verbose=False)
    metrics = first_results(results)
    metrics.update({f"data/{s}/{k}": v for s, stats in datamodule.stats.items() for k, v in stats.items()})
    metrics.update(ckpt_path=source if directory and not Path(source).is_dir() else os.path.abspath(source))
    if directory is None:
        metrics["ckpt_step"] = int(checkpoint.get("global_step", 0))
    metrics["ckpt_sha256"] = digest
    if tables != "own":  # the tables these numbers read
        metrics["tables"] = tables
    if cfg.get("overrides"):  # what these numbers' config changed from the run's
        metrics["overrides"] = [str(override) for override in cfg.overrides]
    if bad := non_finite_metrics(metrics):
        metrics["non_finite"] = bad
        log.warning(
            "non-finite metrics: %s (the checkpoint's weights are finite: an example's loss overflowed)", ", ".join(bad)
        )

    task = getattr(datamodule, "task", None)
    written = {}  # besides metrics.json
    if task and getattr(model, "predictions", None):
        metrics["predictions"] = written["predictions"] = str(task.write_predictions(model.predictions, run_dir()))
    prefix = SPLIT_PREFIX[cfg.split] + "/"
    names = sorted(k[len(prefix) :] for k in metrics if k.startswith(prefix))
    heading = f"{cfg.split}" + (", each statement with another table" if tables != "own" else "")
    print_metrics(f"{heading}: {Path(source).name}", metrics, names, prefix)
    return write_result("metrics", metrics, **written)


main = hydra_app(__name__, evaluate)
