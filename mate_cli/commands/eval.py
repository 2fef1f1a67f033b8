"""`mate eval ckpt_path=<run dir>/checkpoints/<name>.ckpt`: rebuild that run's datamodule
and model from its ``resolved_config.yaml``, evaluate, print Hits@1/3/5, and write
``metrics.json`` atomically into this eval run's directory.

`mate eval experiment=hybridqa_pointr stage1.ckpt_path=... stage2.ckpt_path=...`: PointR
end to end (:func:`mate_cli.pointr.evaluate_pointr`): predictions.json in the official
format, EM/F1 in-table / in-passage / total and Hits@1/3/5 of stage 1."""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from mate_cli.commands.common import quiet_third_party_logs, run_dir, run_task
from mate_cli.errors import MateError
from mate_cli.io import atomic_write_json
from mate_cli.paths import CONF_DIR, register_resolvers

register_resolvers()


def load_run_config(ckpt_path: str, overrides: list[str] | None = None) -> DictConfig:
    """The resolved training config of the run that wrote ``ckpt_path``."""
    ckpt = Path(ckpt_path)
    if not ckpt.is_file():
        raise MateError(f"checkpoint not found: {ckpt}; pass ckpt_path=<run dir>/checkpoints/<name>.ckpt")
    config = ckpt.resolve().parent.parent / "resolved_config.yaml"
    if not config.is_file():
        raise MateError(f"{config} is missing: ckpt_path must point inside a `mate train` run dir (…/checkpoints/*.ckpt)")
    cfg = OmegaConf.load(config)
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    return cfg


def evaluate(cfg: DictConfig) -> dict[str, float]:
    import lightning as L
    import rich
    from hydra.utils import instantiate
    from rich.table import Table

    quiet_third_party_logs()
    if cfg.get("stage1") is not None:
        return evaluate_pointr(cfg)
    if OmegaConf.is_missing(cfg, "ckpt_path") or cfg.ckpt_path is None:
        raise MateError("ckpt_path is missing; pass ckpt_path=<run dir>/checkpoints/<name>.ckpt (or experiment=hybridqa_pointr stage1.ckpt_path=...)")
    train_cfg = load_run_config(cfg.ckpt_path, cfg.get("overrides"))
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(train_cfg.dataset)
    model = instantiate(train_cfg.model)
    trainer = L.Trainer(**OmegaConf.to_container(cfg.trainer, resolve=True))
    if cfg.split == "validation":
        results = trainer.validate(model, datamodule=datamodule, ckpt_path=cfg.ckpt_path, verbose=False)
    elif cfg.split == "test":
        results = trainer.test(model, datamodule=datamodule, ckpt_path=cfg.ckpt_path, verbose=False)
    else:
        raise MateError(f"split={cfg.split!r} is invalid; use split=validation or split=test")
    metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    metrics.update({f"data/{s}/{k}": v for s, stats in datamodule.stats.items() for k, v in stats.items()})
    metrics["ckpt_path"] = str(cfg.ckpt_path)

    prefix = "val" if cfg.split == "validation" else "test"
    names = ("hits@1", "hits@3", "hits@5", "loss")
    table = Table(title=f"{cfg.split}: {Path(cfg.ckpt_path).name}")
    for name in names:
        table.add_column(name)
    table.add_row(*(f"{metrics.get(prefix + '/' + n, float('nan')):.4f}" for n in names))
    rich.print(table)
    atomic_write_json(run_dir() / "metrics.json", metrics)
    return metrics


def evaluate_pointr(cfg: DictConfig) -> dict:
    """The PointR branch: run the pipeline, print EM/F1 and Hits@k."""
    import rich
    from rich.table import Table

    from mate_cli.pointr import evaluate_pointr as run_pointr

    metrics = run_pointr(cfg, run_dir())
    table = Table(title=f"PointR on {cfg.split} ({metrics['questions']} questions)")
    for name in ("", "EM (%)", "F1 (%)", "count"):
        table.add_column(name)
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for group in ("in_table", "in_passage", "total"):
        if f"{group}/em" in metrics:
            table.add_row(group, fmt(metrics[f"{group}/em"]), fmt(metrics[f"{group}/f1"]), str(metrics[f"{group}/count"]))
    rich.print(table)
    hits = [f"hits@{k}={metrics[f'stage1/hits@{k}']:.4f}" for k in (1, 3, 5) if f"stage1/hits@{k}" in metrics]
    rich.print("stage 1: " + (", ".join(hits) or "no answers to score") + f"; predictions: {run_dir() / 'predictions.json'}")
    return metrics


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="eval")
def main(cfg: DictConfig) -> None:
    run_task(evaluate, cfg)
