"""What every task module shares: the encoder (and any extra layers on it), the optimiser and
schedule from yaml, and the values a run measures once (kept in its checkpoints)."""

from __future__ import annotations

import inspect
import logging
from dataclasses import replace
from typing import Callable, Sequence

import lightning as L
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn
from torchmetrics import MeanMetric

from mate_cli.errors import MateError, check_choice
from mate_cli.trainer.optim import configure
from mate_cli.modeling.dot import DoubleTransformer, Pruned
from mate_cli.modeling.extra_layers import INITS, ExtraLayers
from mate_cli.modeling.embeddings import TYPE_IDS_CHECKED
from mate_cli.modeling.heads import mean_over_tokens

log = logging.getLogger(__name__)

#: what a head on the whole sequence reads (``model.pooling``)
POOLINGS = ("cls", "mean", "query")


class EncoderTaskModule(L.LightningModule):
    """A task on the :class:`~mate_cli.modeling.encoder.TableEncoder`. ``optimizer`` and ``scheduler`` are Hydra
    partials (:mod:`mate_cli.trainer.optim`); ``extra_*``: :mod:`mate_cli.modeling.extra_layers` (0: none); ``dot``:
    :meth:`prune`; ``pooling``: :meth:`pool`; ``frozen``: :meth:`freeze_parts`. The pooler is frozen unless the task
    reads it (``uses_pooler`` with ``pooling=cls``): DDP would wait for its gradients."""

    #: whether the task's heads read the pooled [CLS] (then the pooler trains)
    uses_pooler = False
    #: whether the task's steps run DoT's pruning (:meth:`prune`) when given one
    supports_dot = False

    def __init__(
        self,
        encoder: nn.Module,
        optimizer: Callable,
        scheduler: Callable | None = None,
        extra_layers: int = 0,
        extra_init: str = "default",
        extra_relative: bool = False,
        extra_max_distance: int = 16,
        extra_lr: float | None = None,
        dot: DoubleTransformer | None = None,
        pooling: str = "cls",
        frozen: Sequence[str] = (),
    ) -> None:
        super().__init__()
        check_choice("model.pooling", pooling, POOLINGS)
        self.pooling = pooling
        #: values measured once per run for metrics.json (``start/val/*``, ``dt_fixup/*``), kept in every checkpoint
        #: so a resumed run still reports them
        self.recorded_metrics: dict[str, float] = {}
        self.encoder = encoder
        if extra_init not in INITS:  # checked with no extra layers too: a typo is never ignored
            raise MateError(f"model.extra_init={extra_init!r} is not one of {', '.join(INITS)}")
        self.extra = None
        if extra_layers:
            self.extra = ExtraLayers(encoder.config, extra_layers, extra_init, extra_relative, extra_max_distance)
        self.dot = dot
        if dot is not None:
            if not self.supports_dot:
                raise MateError(
                    f"model.dot: {type(self).__name__} does not run DoT (TabFact, WikiTQ and SQA do); "
                    "set model.dot=null"
                )
            if dot.loss != "joint" and type(self).pruning_loss is EncoderTaskModule.pruning_loss:
                raise MateError(
                    f"model.dot.loss={dot.loss} trains the pruner by a pruning loss on answer cells, which "
                    f"{type(self).__name__} has none of; use model.dot.loss=joint (J-DoT)"
                )
            if extra_layers:
                raise MateError(
                    f"model.extra_layers={extra_layers} with DoT: the extra layers cannot take the pruning "
                    "scores in their attention; set model.extra_layers=0 or model.dot=null"
                )
            if dot.biased:
                encoder.check_key_bias()
            if dot.pruner.config.vocab_size != encoder.config.vocab_size:
                raise MateError(
                    f"model.dot: the pruning transformer has a {dot.pruner.config.vocab_size}-piece "
                    f"vocabulary, the task model {encoder.config.vocab_size}; both read the same word "
                    "pieces, so pick a pruner checkpoint with the task model's vocabulary"
                )
        if extra_lr is not None and not extra_lr > 0:
            raise MateError(f"model.extra_lr={extra_lr} is invalid: a learning rate > 0, or null (the optimiser's)")
        self.extra_lr = extra_lr
        self.optimizer, self.scheduler = optimizer, scheduler
        warmup = getattr(scheduler, "keywords", {}).get("warmup_ratio", 0)
        if self.extra is not None and self.extra.init == "dt_fixup" and warmup:
            raise MateError(
                f"model.extra_init=dt_fixup trains without learning-rate warm-up (Xu et al. 2021, §3.3), "
                f"but model.scheduler.warmup_ratio={warmup}; set model.scheduler.warmup_ratio=0"
            )
        if hasattr(encoder, "pooler") and not (self.uses_pooler and pooling == "cls"):
            encoder.pooler.requires_grad_(False)
        self.freeze_parts([str(prefix) for prefix in frozen])

    def freeze_parts(self, prefixes: list[str]) -> None:
        """``model.frozen``: the parameters under each prefix (``encoder.embeddings``, ``encoder.encoder.layer.0``,
        ``extra``...) keep the values they were loaded with; the rest trains. Only the encoder, the extra layers and
        DoT's pruner can be frozen: the task's heads are built after this and always train. A prefix that names no
        parameter is refused, so a typo never trains the whole model unnoticed."""
        named = dict(self.named_parameters())
        chosen = {}
        for prefix in prefixes:
            under = {n: p for n, p in named.items() if n == prefix or n.startswith(prefix + ".")}
            if not under:
                raise MateError(
                    f"model.frozen: {prefix!r} names no parameter of the encoder, extra layers or pruner (the heads "
                    "always train); use a prefix of their parameter names, e.g. encoder.embeddings, "
                    "encoder.encoder.layer.0 or encoder.encoder (every layer)"
                )
            chosen.update(under)
        for parameter in chosen.values():
            parameter.requires_grad_(False)
        if chosen:
            count = sum(p.numel() for p in chosen.values())
            log.info("model.frozen=%s: %d parameters keep their loaded values", prefixes, count)

    def save_hyperparameters(self, *args, ignore=None, frame=None, logger: bool = True) -> None:
        """Lightning's, with Hydra's list and dict configs among the arguments (``model.frozen``) kept as plain lists
        and dicts: a checkpoint holds only what loads weights-only."""
        frame = frame or inspect.currentframe().f_back
        super().save_hyperparameters(*args, ignore=ignore, frame=frame, logger=logger)
        for hparams in (self._hparams, getattr(self, "_hparams_initial", {})):
            for key, value in list(hparams.items()):
                if isinstance(value, (DictConfig, ListConfig)):
                    hparams[key] = OmegaConf.to_container(value, resolve=True)

    def check_type_ids(self, batch) -> None:
        """The batch's token-type ids against every embedding table that reads them, before the batch moves to the
        device (so no forward on a GPU waits for the host); marked checked, so no forward on a CPU checks again."""
        for encoder in [self.encoder] + ([self.dot.pruner] if self.dot is not None else []):
            encoder.embeddings.check_type_ids(encoder.backends[0].embedding_layout(batch.layout))
        batch.layout.cached(TYPE_IDS_CHECKED, lambda: True)

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        self.check_type_ids(batch)
        return batch

    def batch_to_device(self, batch, device: torch.device | None = None):
        """``batch`` on ``device`` (default: this module's), checked as in Lightning's loops, for the loops outside."""
        self.check_type_ids(batch)
        return batch.to(self.device if device is None else torch.device(device))

    def encode(self, input_ids: torch.Tensor, layout) -> torch.Tensor:
        hidden = self.encoder(input_ids, layout)
        return hidden if self.extra is None else self.extra(hidden, layout.attention_mask)

    def pool(self, hidden: torch.Tensor, layout) -> torch.Tensor:
        """``[batch, hidden]``: ``cls``, the [CLS] state through the checkpoint's pooler (TAPAS); ``mean`` over the
        real tokens (how sentence encoders such as the bundled MiniLM were trained; its pooler never was); or ``query``,
        the mean over the query set (the statement or question, [CLS], [SEP]: the tokens that attend to the whole table
        under MATE), which a long table does not outweigh."""
        if self.pooling == "cls":
            return self.encoder.pooler(hidden)
        return mean_over_tokens(hidden, layout.is_query if self.pooling == "query" else layout.attention_mask)

    def prune(self, batch):
        """DoT: ``(batch of the kept tokens, Pruned)``, else ``(batch, None)``. Per-cell tensors (by cell id) stay as
        they are; a cell with no kept token is never selected."""
        if self.dot is None:
            return batch, None
        positions = self.encoder.embeddings.position_ids(self.encoder.backends[0].embedding_layout(batch.layout))
        pruned = self.dot(batch.input_ids, batch.layout, positions)
        return replace(batch, input_ids=pruned.input_ids, layout=pruned.layout), pruned

    def with_pruning_loss(self, loss: torch.Tensor, batch, pruned: Pruned | None) -> torch.Tensor:
        """The training loss: the task's, plus the pruning loss for P-DoT and PJ-DoT (logged)."""
        if pruned is None or self.dot.loss == "joint":
            return loss
        extra = self.pruning_loss(batch, pruned)
        self.log("train/pruning_loss", extra, batch_size=len(batch), sync_dist=True)
        return loss + extra

    def pruning_loss(self, batch, pruned: Pruned) -> torch.Tensor:
        """P-DoT's and PJ-DoT's pruner loss (App. C.2), for tasks with answer cells (``TableQAModule``)."""
        raise NotImplementedError

    def log_train_metric(self, name: str, values: torch.Tensor, batch_size: int) -> None:
        """``train/<name>``: the mean of ``values``, the task's metric on this batch as trained (dropout on)."""
        self.log(f"train/{name}", values.detach().float().mean(), batch_size=batch_size, sync_dist=True)

    def on_fit_start(self) -> None:
        if self.extra is not None and self.extra.needs_mu:
            self._dt_fixup()

    @torch.no_grad()
    def _dt_fixup(self) -> None:
        """DT-Fixup's ``mu = max_j ||x_j||`` over the encoder's outputs on the training set (max over DDP ranks)."""
        was_training = self.training
        self.eval()
        mu = torch.zeros((), device=self.device)
        for batch in self.trainer.datamodule.train_dataloader():
            batch = self.batch_to_device(batch)
            norms = self.encoder(batch.input_ids, batch.layout).norm(dim=-1)
            mu = torch.maximum(mu, norms[batch.layout.attention_mask].max().float())
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(mu, op=torch.distributed.ReduceOp.MAX)
        self.train(was_training)
        mu, n = float(mu), len(self.extra.layers)
        scale = self.extra.apply_dt_fixup(mu)
        self.recorded_metrics.update({"dt_fixup/mu": mu, "dt_fixup/scale": scale})
        log.info("DT-Fixup: mu = max ||x_j|| over the training set = %.4f; %d new layers scaled by %.6g", mu, n, scale)

    def configure_optimizers(self):
        return configure(self, self.optimizer, self.scheduler, self.own_rates())

    def own_rates(self) -> dict[str, float] | None:
        """Submodules trained at a learning rate of their own (:func:`mate_cli.trainer.optim.parameter_groups`)."""
        return {"extra": self.extra_lr} if self.extra_lr else None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["mate_recorded_metrics"] = dict(self.recorded_metrics)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.recorded_metrics = dict(checkpoint.get("mate_recorded_metrics", {}))

    def export_pretrained(self, directory, tokenizer=None):
        if self.dot is not None:
            log.warning(
                "export_encoder: this is DoT's task model alone; without the pruning transformer it reads "
                "every token with no scores, which is not the model that was trained"
            )
        return self.encoder.save_pretrained(directory, tokenizer=tokenizer)


def stage_metrics(*means: str, **others: type) -> nn.ModuleDict:
    """``<stage>_<name>`` for ``val`` and ``test``: a ``MeanMetric`` per name in ``means``, plus ``others[name]()``."""
    kinds = {**dict.fromkeys(means, MeanMetric), **others}
    return nn.ModuleDict({f"{stage}_{name}": kind() for stage in ("val", "test") for name, kind in kinds.items()})


class EvaluatedTaskModule(EncoderTaskModule):
    """A task whose validation and test are one ``_eval_step(batch, stage)``, ``stage`` ``val`` or ``test``."""

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def update_logged(self, stage: str, name: str, *values, batch_size: int, prog_bar: bool = False, **weight) -> None:
        """Update the ``<stage>_<name>`` metric (:func:`stage_metrics`) and log it as ``<stage>/<name>``."""
        metric = self.metrics[f"{stage}_{name}"]
        metric.update(*values, **weight)
        self.log(f"{stage}/{name}", metric, prog_bar=prog_bar, batch_size=batch_size)
