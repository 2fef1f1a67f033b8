"""A ``transformers`` TAPAS task directory (``TapasForQuestionAnswering``: SQA, WikiTQ;
``TapasForSequenceClassification``: TabFact), as Google's published ``google/tapas-*-finetuned-{sqa,wtq,tabfact}``
are, scored as it is by ``mate eval`` and ``mate predict``: the run config it stands for is composed from
``conf/train.yaml`` with the task's dense experiment (``<task>_tapas``), the directory as
``model.encoder.pretrained`` (so its encoder, task head and head settings load), [CLS] through its pooler
(``model.pooling=cls``) and then the command's ``overrides``, which are ``mate train`` overrides here
(``attention=mate``, ``dataset.root=<folder>``).

The head settings of the directory's ``config.json`` decide the function (the task yaml's values step back for
them); an override names one explicitly to change it. A directory whose head does not fit the task, or that holds no
task head, is one `MateError` line naming what differs."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, open_dict

from mate_cli.config.naming import register_resolvers
from mate_cli.errors import MateError
from mate_cli.lit_modules.entailment import VERDICTS
from mate_cli.modeling.checkpoints import read_state_dict, rename_state_dict
from mate_cli.modeling.tapas_heads import AGGREGATIONS, TapasHeadConfig
from mate_cli.paths import CONF_DIR
from mate_cli.pretrained import HUB_ID, read_config, resolve_pretrained, weight_files

log = logging.getLogger(__name__)

#: transformers' task classes -> the tasks their head serves (the question-answering head: by its aggregation labels)
ARCHITECTURES = {"TapasForQuestionAnswering": ("sqa", "wtq"), "TapasForSequenceClassification": ("tabfact",)}
TASK_NAMES = {"sqa": "SQA", "wtq": "WikiTQ", "tabfact": "TabFact"}


@dataclass(frozen=True)
class TaskDirectory:
    """``source`` as given; ``resolved`` its local folder or hub id; ``task`` the one its head serves; ``settings``
    its ``config.json``."""

    source: str
    resolved: str
    task: str
    settings: dict

    @property
    def architecture(self) -> str:
        return next(name for name in self.settings.get("architectures") or [] if name in ARCHITECTURES)


def task_directory(value: str | Path | None, key: str = "ckpt_path") -> TaskDirectory | None:
    """The TAPAS task directory ``value`` names, or None when it names something else (a run dir, a checkpoint file,
    a path that does not exist here). A local folder counts when it holds a ``config.json``; a hub id (``org/name``
    where no folder ``org`` is here) when the hub has it. A TAPAS folder without a task head is one `MateError` line."""
    if value is None:
        return None
    text = str(value).strip()
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            return None
    elif path.exists() or text.count("/") != 1 or not HUB_ID.match(text) or Path(text.split("/")[0]).exists():
        return None  # a file, or a path under a folder that is here (outputs/<run>): not a hub id
    try:
        resolved = resolve_pretrained(text)
        settings = read_config(resolved)
    except MateError as error:
        if path.is_dir():
            raise
        reason = str(error).split(" (", 1)[-1].split(")", 1)[0]
        raise MateError(
            f"{key}={text}: no run dir or checkpoint of that path here, and no hub model of that id ({reason}); "
            "pass a run dir, a checkpoint or a TAPAS task directory"
        ) from None
    names = [str(name) for name in settings.get("architectures") or []]
    found = [name for name in names if name in ARCHITECTURES]
    if settings.get("model_type") != "tapas" or not found:
        what = ", ".join(names) or f"a {settings.get('model_type') or 'model'} without architectures"
        raise MateError(
            f"{key}={text} is a transformers directory of {what}, not a TAPAS task model; mate scores "
            "TapasForQuestionAnswering (SQA, WikiTQ) and TapasForSequenceClassification (TabFact) directories: "
            f"train one from it with `mate train experiment=<task>_tapas model.encoder.pretrained={text}`"
        )
    tasks = ARCHITECTURES[found[0]]
    task = str(settings.get("mate_task") or "")  # `mate export` records it; else the head's settings say
    if task not in tasks:
        task = tasks[0] if len(tasks) == 1 else ("wtq" if int(settings.get("num_aggregation_labels") or 0) else "sqa")
    return TaskDirectory(source=text, resolved=resolved, task=task, settings=settings)


def quoted(value: str) -> str:
    """``value`` as a Hydra override value (quoted where its grammar would read a path's characters)."""
    return value if all(c.isalnum() or c in "/._-~" for c in value) else "'" + value.replace("'", "\\'") + "'"


def compose_train(fixed: Sequence[str], given: Sequence[str]) -> DictConfig:
    """``conf/train.yaml`` composed with the ``fixed`` overrides, then the user's ``given`` ones, by Hydra's compose
    API: inside a command, through its own initialisation (the same ``conf/``); elsewhere through one of its own,
    cleared after."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_resolvers()
    try:
        if GlobalHydra.instance().is_initialized():
            return compose("train", overrides=[*fixed, *given])
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose("train", overrides=[*fixed, *given])
    except (HydraException, OmegaConfBaseException) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise MateError(
            f"overrides={list(given)}: {reason}; for a TAPAS task directory they are `mate train` "
            "overrides (attention=mate, dataset.root=<folder>, dataset.max_length=1024)"
        ) from None


def task_run_config(directory: TaskDirectory, overrides: Sequence[str], paths: DictConfig | None = None) -> DictConfig:
    """The run config ``directory`` stands for (module docstring), with this command's ``paths`` if given; refused in
    one line where the dataset's task or the head's settings do not fit the directory's head."""
    given = [str(override) for override in overrides]
    fixed = [f"experiment={directory.task}_tapas", f"model.encoder.pretrained={quoted(directory.resolved)}",
             "++model.pooling=cls"]  # fmt: skip
    cfg = compose_train(fixed, given)
    task = str(cfg.dataset.get("task") or "hybridqa")
    if task != directory.task:
        raise MateError(
            f"ckpt_path={directory.source} is a {directory.architecture} for {TASK_NAMES[directory.task]}, and "
            f"{TASK_NAMES.get(task, task)} (dataset={task}) needs another head; score it on its own task "
            f"(drop the dataset override, or pass dataset={directory.task} with dataset.root=<folder>)"
        )
    check_head_fits(directory)
    explicit = {override.split("=", 1)[0].lstrip("+~") for override in given}
    with open_dict(cfg):
        if paths is not None:
            cfg.paths = paths
        head = cfg.model.get("head")
        for name in list(head or {}):  # the directory's settings decide, unless an override names one
            if directory.settings.get(name) is not None and f"model.head.{name}" not in explicit:
                head[name] = None
    return cfg


def check_head_fits(directory: TaskDirectory) -> None:
    """One `MateError` line where the directory's head settings are not its task's head (the number of operators or
    labels); the settings TAPAS's head refuses are refused by :class:`TapasHeadConfig` as for any run."""
    settings, where = directory.settings, f"ckpt_path={directory.source}"
    if directory.task == "tabfact":
        labels = len(settings.get("id2label") or {}) or int(settings.get("num_labels") or len(VERDICTS))
        if labels != len(VERDICTS):
            raise MateError(
                f"{where}: its classifier has {labels} labels; TabFact's has {len(VERDICTS)} ({', '.join(VERDICTS)}): "
                "pass a TapasForSequenceClassification fine-tuned on TabFact"
            )
        return
    operators = int(settings.get("num_aggregation_labels") or 0)
    if directory.task == "wtq" and operators != len(AGGREGATIONS):
        raise MateError(
            f"{where}: its head has num_aggregation_labels={operators}; WikiTQ's classifies "
            f"{len(AGGREGATIONS)} operators ({', '.join(AGGREGATIONS)}): pass a TapasForQuestionAnswering "
            "fine-tuned on WikiTQ"
        )
    fields = {name for name in TapasHeadConfig.__dataclass_fields__}
    try:
        TapasHeadConfig.from_checkpoint({}, {k: v for k, v in settings.items() if k in fields})
    except MateError as error:  # worded for a yaml; here the directory's config.json holds the setting
        raise MateError(
            f"{where}: its config.json's head settings are not a head mate trains or scores ({error}); pass a "
            f"{TASK_NAMES[directory.task]} task model with TAPAS's answer-supervised head settings"
        ) from None


def check_head_loaded(directory: TaskDirectory, model) -> None:
    """One `MateError` line unless every tensor of ``model.head`` came from the directory (a head it lacks would be
    scored at its random initialisation). Shapes that differ are refused as the head loads."""
    names = set(rename_state_dict(read_state_dict(weight_files(directory.resolved))))
    missing = sorted(set(model.head.state_dict()) - names)
    if missing:
        raise MateError(
            f"ckpt_path={directory.source} holds no {', '.join(missing)}: its {directory.architecture} head is "
            f"incomplete, and {TASK_NAMES[directory.task]} would be scored with a random head; export or save "
            "the whole task model again"
        )


def weights_digest(directory: TaskDirectory) -> str:
    """The first 16 hex digits of the SHA-256 over the directory's weight files, in order (``metrics.json``)."""
    digest = hashlib.sha256()
    for path in weight_files(directory.resolved):
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def describe(directory: TaskDirectory) -> str:
    where = directory.resolved if Path(directory.resolved).is_dir() else f"hub model {directory.resolved}"
    return f"{where}: a {directory.architecture} for {TASK_NAMES[directory.task]}"
