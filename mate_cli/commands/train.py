"""`mate train`: fit (or resume: ``ckpt_path=``; or start from a run's weights: ``init_from=``), validate the best
checkpoint, write ``metrics.json``. The run dir's files: docs/runs.md; the switches around fitting: ``conf/train.yaml``.

Under DDP every rank runs :func:`train`, rank 0 alone prints and writes; the final validation sees each example once
across the ranks, so its metrics equal a one-process ``mate eval`` of the same checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from torchmetrics import Metric

from mate_cli.commands.common import first_results, hydra_app, instantiate_dict, log, print_metrics
from mate_cli.commands.common import quiet_third_party_logs
from mate_cli.run.job import command_overrides, finish_wandb_run, hydra_choices, run_dir
from mate_cli.console import print_config, print_outputs
from mate_cli.data.sampler import each_example_once
from mate_cli.callbacks.divergence import StopOnNonFiniteLoss, non_finite_metrics
from mate_cli.errors import MateError
from mate_cli.callbacks.interrupts import StopOnSignal, cluster_plugins
from mate_cli.callbacks.ranks import WatchRanks
from mate_cli.run import stages, sweep
from mate_cli.callbacks.budget import MINUTES_KEY, BudgetSpent, FitClock
from mate_cli.io import atomic_write_json, atomic_write_text
from mate_cli.callbacks.step_profile import StepProfile
from mate_cli.pretrained import load_tokenizer, load_weights_only
from mate_cli.run.resume import AtomicCheckpointIO, changed_on_resume
from mate_cli.callbacks.resume_state import RESTORED, ContinuousCSVLog, ResumeState
from mate_cli.run.resume import continue_wandb_run, resolve_resume_path, run_dir_of
from mate_cli.callbacks.resume_state import unrestored
from mate_cli.run.rebuild import check_checkpoint_fits, init_weights_from
from mate_cli.config.schema import TRAINER_RESERVED, check_trainer_args


def train(cfg: DictConfig) -> dict[str, float]:
    """Returns what ``metrics.json`` holds."""
    quiet_third_party_logs()
    out = run_dir()
    if (earlier := sweep.done_earlier(out)) is not None:  # a sweep run again: this job finished in an earlier call
        print_summary(earlier, bool(cfg.get("validate_best", True)))
        return earlier
    stages.resolve_earlier_stage(cfg)
    resume = _start(cfg, out)
    datamodule, model, trainer, loggers, checkpoint = _build(cfg, out, resume)
    _before_fit(cfg, trainer, model, datamodule, resume, checkpoint)
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=resume)
    except ValueError:
        _check_validation_interval(trainer)
        raise
    except BudgetSpent as spent:  # cut, not finished: the same command goes on from its last.ckpt
        log.warning("%s", spent)
        finish_wandb_run()
        return {}
    metrics = _final_metrics(cfg, trainer, model, datamodule, out, resume, checkpoint)
    _keep_best(cfg, trainer, model, out, metrics)
    return _finish(cfg, trainer, out, metrics, loggers)


def last_checkpoint(out: Path) -> Path:
    return out / "checkpoints" / "last.ckpt"


def _start(cfg: DictConfig, out: Path) -> str | None:
    """The run dir claimed and recorded, the checkpoint to resume from (or None), the seed set."""
    check_own_folder(out / "checkpoints")
    given = cfg.get("ckpt_path") or sweep.resume_point(out)  # a sweep run again: a job cut earlier goes on
    resume = resolve_resume_path(given, out.parent, str(cfg.experiment_name), this_run=out)
    continue_wandb_run(cfg, resume)  # before resolved_config.yaml records it
    if rank_zero_only.rank == 0:  # DDP ranks > 0 re-run this command into the same run dir
        if resume and (changed := changed_on_resume(cfg, resume)):  # before resolved_config.yaml is written
            sweep.refuse_changed_job(out, changed)
            shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
            log.warning("resuming with %d value(s) changed from the resumed run's config: %s; the run goes on with "
                        "this command's", len(changed), shown)  # fmt: skip
        whole = bool(OmegaConf.select(cfg, "extras.print_config", default=False))
        print_config(cfg, command_overrides(), out, whole=whole)
        atomic_write_text(out / "resolved_config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    else:  # their log goes to <run dir>/train_ddp_process_<rank>.log only, not to the screen
        for handler in list(logging.getLogger().handlers):
            if type(handler) is logging.StreamHandler:
                logging.getLogger().removeHandler(handler)
    L.seed_everything(cfg.seed, workers=True)
    return resume


def _build(cfg: DictConfig, out: Path, resume: str | None):
    """``(datamodule, model, trainer, loggers, checkpoint)``; ``checkpoint``: the resumed one, checked and preloaded."""
    trainer_args = check_trainer_args(OmegaConf.to_container(cfg.trainer, resolve=True), TRAINER_RESERVED)
    clock = FitClock(last_checkpoint(out), trainer_args.pop("max_time", None))  # each call's budget
    _check_pairing(cfg)
    datamodule = instantiate(cfg.dataset)
    model = instantiate(cfg.model)
    if cfg.get("init_from") and not resume:  # a resumed run has its weights from its own checkpoint
        log.info(init_weights_from(model, cfg.init_from))
    checkpoint_io, checkpoint = AtomicCheckpointIO(), None
    if resume:  # checked before any data is prepared; Lightning then loads the checked copy
        checkpoint = check_checkpoint_fits(resume, model, "ckpt_path", resume=True)
        checkpoint_io.preload(resume, checkpoint)
        if 0 <= trainer_args.get("max_steps", -1) <= checkpoint.get("global_step", 0):
            log.warning("the resumed run is at step %d, trainer.max_steps=%d: nothing is trained; raise "
                        "trainer.max_steps to go on",
                        checkpoint.get("global_step", 0), trainer_args["max_steps"])  # fmt: skip
    callbacks = [
        *instantiate_dict(cfg.get("callbacks")),
        ResumeState(),
        StopOnSignal(last_checkpoint(out), in_sweep=sweep.is_sweep_job()),
        clock,
        WatchRanks(out),
        StopOnNonFiniteLoss(),
        csv_log := ContinuousCSVLog(run_dir_of(resume) if resume else None),
    ]
    if cfg.get("profile_steps"):  # first: a step's window opens before any other callback's work at its start (the
        # LR monitor's copy to the device on a logging step belongs to that step, not to the one before)
        callbacks.insert(0, StepProfile(int(cfg.profile_steps), path=out / "step_profile.json"))
    loggers = instantiate_dict(cfg.get("logger"))
    trainer_args.setdefault("default_root_dir", str(out))  # whatever Lightning writes of its own stays in the run dir
    plugins = [checkpoint_io, *cluster_plugins()]
    trainer = L.Trainer(**trainer_args, callbacks=callbacks, logger=loggers, plugins=plugins)
    _refuse_ddp_in_a_local_sweep(trainer)
    csv_log.continue_earlier(trainer, checkpoint)
    for lg in loggers:
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    return datamodule, model, trainer, loggers, checkpoint


def _before_fit(cfg: DictConfig, trainer, model, datamodule, resume: str | None, checkpoint: dict | None) -> None:
    """What a resume restores, said; or the starting checkpoint's validation (``validate_start``)."""
    if resume and (lost := unrestored(checkpoint, model)):
        checkpoint.setdefault("lr_schedulers", [])  # Lightning restores an empty list (none), but fails on no key
        log.warning("resuming from %s: weights, optimiser and step are restored, but the checkpoint holds nothing of "
                    "%s, so training does not continue exactly as it would have",
                    resume, " nor of ".join(lost))  # fmt: skip
    elif resume:
        log.info("resuming from %s: %s", resume, RESTORED)
    elif cfg.get("validate_start", False):  # the starting checkpoint's score, to compare the end with
        results = trainer.validate(model, **_validation_data(trainer, datamodule), verbose=False)
        model.recorded_metrics.update({f"start/{k}": v for k, v in first_results(results).items()})
        for metric in (m for m in model.modules() if isinstance(m, Metric)):
            metric.reset()  # validate left inference-mode state tensors, which fit's validation cannot update


def _final_metrics(
    cfg: DictConfig, trainer, model, datamodule, out: Path, resume: str | None, checkpoint: dict | None
) -> dict:
    """``metrics.json``'s content: the best checkpoint's validation (and test), data statistics, the last training
    metrics and what the run recorded before."""
    # start/val/*, dt_fixup/*; a resumed run has them from its checkpoint
    start = dict(getattr(model, "recorded_metrics", {}))
    # the last epoch's perf/*; the last logged training batch's metric and loss (debug=overfit: the fixed batch)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("perf/", "train/"))}
    logged[MINUTES_KEY] = next(c for c in trainer.callbacks if isinstance(c, FitClock)).minutes()  # every call's fit
    trainer.save_checkpoint(last_checkpoint(out))  # the final state is the newest
    best = trainer.strategy.broadcast(_best_checkpoint(trainer, last_checkpoint(out)))
    if cfg.get("validate_best", True):
        results = trainer.validate(model, **_validation_data(trainer, datamodule), ckpt_path=best, verbose=False)
        metrics = first_results(results)
    else:  # the last validation inside fit (val_check_interval), when one ran
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if not metrics and checkpoint is not None and trainer.global_step == checkpoint.get("global_step"):
            # resumed with nothing left to train: its validations ran before the stop; score the final weights
            log.info(
                "validating the final weights (%s): the resumed run had nothing left to train", last_checkpoint(out)
            )
            results = trainer.validate(
                model, **_validation_data(trainer, datamodule), ckpt_path=str(last_checkpoint(out)), verbose=False
            )
            metrics = first_results(results)
    if cfg.get("test_after_training", False):
        metrics.update(_test_best(trainer, model, datamodule, best))
    data = {f"data/{split}/{k}": v for split, stats in datamodule.stats.items() for k, v in stats.items()}
    tags = [str(tag) for tag in cfg.get("tags") or []]
    metrics.update({**data, **logged, **start, "best_checkpoint": best, "tags": tags})
    if resume:
        metrics["resumed_from"] = resume
    if cfg.get("init_from"):  # a stage's matching run (mate_cli.run.stages) or the run given
        metrics["started_from"] = str(cfg.init_from)
    return metrics


def _keep_best(cfg: DictConfig, trainer, model, out: Path, metrics: dict) -> None:
    """``export_encoder`` and ``keep_best=encoder``: the best as a transformers directory, its checkpoint removed."""
    keep_encoder_only = cfg.get("keep_best", "checkpoint") == "encoder"
    if (cfg.get("export_encoder") or keep_encoder_only) and trainer.is_global_zero:
        best = metrics["best_checkpoint"]
        metrics["exported_encoder"] = str(export_encoder(model, best, cfg, out / "encoder"))
        if keep_encoder_only and Path(best) != last_checkpoint(out) and _own(best, out):
            Path(best).unlink(missing_ok=True)  # the best now lives in encoder/ only
            metrics["best_kept_as"] = metrics["exported_encoder"]


def _finish(cfg: DictConfig, trainer, out: Path, metrics: dict, loggers) -> dict:
    """``metrics.json`` written, the loggers closed, the summary and the run's files on screen."""
    if bad := non_finite_metrics(metrics):
        metrics["non_finite"] = bad
        log.warning("non-finite metrics: %s", ", ".join(bad))
    if trainer.is_global_zero:
        atomic_write_json(out / "metrics.json", metrics)
    for lg in loggers:
        lg.log_metrics({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=trainer.global_step)
        lg.finalize("success")
    wandb_run = finish_wandb_run()
    if trainer.is_global_zero:
        print_summary(metrics, bool(cfg.get("validate_best", True)))
        print_outputs(outputs(out, metrics, loggers, wandb_run))
    return metrics


def print_summary(metrics: dict, validated_best: bool = True) -> None:
    """The final validated metrics on screen; with ``validate_best=false``, the last ``val/*`` and ``train/*``."""

    def floats(*prefixes: str) -> list[str]:
        return sorted(k for k, v in metrics.items() if k.startswith(prefixes) and isinstance(v, float))

    if validated_best:
        shown = floats("start/val/", "val/")
        start = "; start/*: the starting checkpoint" if any(k.startswith("start/") for k in shown) else ""
        title = f"final validation (best checkpoint{start})"
    else:
        shown = floats("val/", "train/")
        title = "no final validation: the last validation during training (val/*) and training batch (train/*)"
    if shown:
        print_metrics(title, metrics, shown)


def outputs(out: Path, metrics: dict, loggers, wandb_run: Path | None) -> dict[str, object]:
    found = {"run dir": out, "metrics": out / "metrics.json", "best checkpoint": metrics["best_checkpoint"],
             "last checkpoint": last_checkpoint(out)}  # fmt: skip
    if not Path(metrics["best_checkpoint"]).exists():  # keep_best=encoder removed it
        del found["best checkpoint"]
    if metrics.get("exported_encoder"):
        found["encoder"] = metrics["exported_encoder"]
    for logger in loggers:
        if isinstance(logger, CSVLogger) and Path(logger.experiment.metrics_file_path).is_file():
            found["csv log"] = logger.experiment.metrics_file_path
    if wandb_run is not None:
        offline = "offline" in wandb_run.name
        found["wandb run"] = f"{wandb_run} (offline: upload with `wandb sync {wandb_run}`)" if offline else wandb_run
    return found


def export_encoder(model, ckpt_path: str, cfg: DictConfig, directory: Path) -> Path:
    model.load_state_dict(load_weights_only(ckpt_path, "export from a checkpoint this run wrote")["state_dict"])
    return model.export_pretrained(directory, tokenizer=load_tokenizer(cfg.model.encoder.pretrained))


def _refuse_ddp_in_a_local_sweep(trainer) -> None:
    """Lightning's DDP launcher re-executes the command line for ranks > 0: in a local sweep each would rerun it all."""
    launcher = getattr(trainer.strategy, "launcher", None)
    if (
        HydraConfig.get().mode == RunMode.MULTIRUN
        and isinstance(launcher, _SubprocessScriptLauncher)
        and not launcher.cluster_environment.creates_processes_externally
    ):
        hardware = hydra_choices().get("hardware")
        raise MateError(
            f"hardware={hardware} starts one process per device, which a local sweep (-m) cannot do; "
            "run each job without -m, or sweep on a cluster with hydra/launcher=slurm"
        )


def _check_validation_interval(trainer) -> None:
    """Lightning's refusal of a step-count ``val_check_interval`` longer than an epoch, as one line with the fixes."""
    interval, batches = trainer.val_check_batch, trainer.fit_loop.max_batches
    within_epochs = trainer.check_val_every_n_epoch is not None
    if isinstance(interval, int) and isinstance(batches, int) and interval > batches and within_epochs:
        raise MateError(
            f"trainer.val_check_interval={trainer.val_check_interval} is more than the {batches} training batches of "
            f"one epoch; use trainer.val_check_interval<={batches}, or add trainer.check_val_every_n_epoch=null to "
            "count the interval across epochs"
        )


def check_own_folder(folder: Path) -> None:
    """A run writes its checkpoints into its own run dir only: a ``checkpoints/`` that links elsewhere (into another
    run, whose last.ckpt a resume in place then overwrote) is refused in one line."""
    if folder.is_symlink() or folder.exists() and folder.resolve().parent != folder.parent.resolve():
        raise MateError(
            f"{folder} is a link to {folder.resolve()}: a run writes its checkpoints into its own run dir only; "
            "remove the link (move its files in first if they are this run's)"
        )


def _check_pairing(cfg: DictConfig) -> None:
    """Pre-training corpora go with the masked-LM module only, and the other way round (checked before data loads)."""
    corpus = str(OmegaConf.select(cfg, "dataset._target_", default="")).endswith(".PretrainDataModule")
    masked_lm = str(OmegaConf.select(cfg, "model._target_", default="")).endswith(".MaskedLMModule")
    if corpus != masked_lm:
        choices = hydra_choices()
        raise MateError(
            f"dataset={choices.get('dataset')} does not go with model={choices.get('model')}: "
            "`mate pretrain` reads dataset=pretrain_sample or pretrain_jsonl, `mate train` the task datasets"
        )


def _test_best(trainer, model, datamodule, best: str) -> dict[str, float]:
    """``test/*`` of the best checkpoint when the test split has answers (releases often hold none); else a log line."""
    if not hasattr(datamodule, "questions") or trainer.world_size > 1:
        name = type(datamodule).__name__
        why = "runs on one device" if trainer.world_size > 1 else f"needs a question dataset, not {name}"
        log.info("test_after_training: skipped (it %s; use `mate eval ckpt_path=<run dir> split=test`)", why)
        return {}
    try:
        questions = datamodule.questions("test")
    except MateError as err:
        log.info("test_after_training: skipped, no test split (%s)", err)
        return {}
    if not any(q.answered for q in questions):
        log.info("test_after_training: skipped, the test split's %d questions have no answers", len(questions))
        return {}
    return first_results(trainer.test(model, datamodule=datamodule, ckpt_path=best, verbose=False))


def _validation_data(trainer, datamodule) -> dict:
    """``trainer.validate``'s data: under DDP every validation example on exactly one rank."""
    if trainer.world_size == 1:
        return dict(datamodule=datamodule)
    datamodule.setup("validate")
    return dict(dataloaders=each_example_once(datamodule.val_dataloader(), trainer.world_size, trainer.global_rank))


def _best_checkpoint(trainer, last: Path) -> str:
    """The monitored best checkpoint when this run wrote one, else ``last``."""
    for callback in trainer.checkpoint_callbacks:
        best = getattr(callback, "best_model_path", "")
        if callback.monitor and best and Path(best).exists() and _own(best, last.parent.parent):
            return best
    return str(last)


def _own(path: str | Path, out: Path) -> bool:
    return Path(path).resolve().parent == (out / "checkpoints").resolve()


def objective(cfg: DictConfig, metrics) -> float | None:
    """What a sweeper optimises: the monitored validation metric of the finished run."""
    monitor = OmegaConf.select(cfg, "callbacks.best_checkpoint.monitor", default=None) or "val/hits@1"
    return metrics.get(monitor) if isinstance(metrics, dict) else None


main = hydra_app(__name__, train, objective)
