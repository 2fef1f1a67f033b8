"""What a run dir's config may instantiate: only the ``_target_`` values ``conf/`` names, as a run dir is data and
must not run code. The resolved copy that is checked is what gets built, so no interpolation brings in a target after
the check. ``trust_run_config=true`` lifts the check, with a warning."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Iterator

import yaml
from omegaconf import DictConfig, OmegaConf

from mate_cli.errors import MateError
from mate_cli.paths import CONF_DIR

log = logging.getLogger(__name__)

TARGET = "_target_"

#: targets that earlier versions of ``conf/`` named and run dirs written then still hold (each still importable)
FORMER_TARGETS = frozenset({"lightning.pytorch.callbacks.RichProgressBar"})
#: targets that earlier versions of ``conf/`` named by a module path that has moved since: a run dir written then is
#: read with the current name (:func:`mate_cli.config.yaml_data.read_run_config`); every value is a current target
RENAMED_TARGETS = {
    "mate_cli.wandb_logger.WandbLogger": "mate_cli.trainer.wandb_logger.WandbLogger",
    "mate_cli.lit_modules.wandb_logger.WandbLogger": "mate_cli.trainer.wandb_logger.WandbLogger",
    "mate_cli.lit_modules.optim.linear_warmup": "mate_cli.trainer.optim.linear_warmup",
    "mate_cli.lit_modules.progress_log.ProgressLog": "mate_cli.callbacks.progress_log.ProgressLog",
    "mate_cli.lit_modules.progress_log.RichProgressBar": "mate_cli.callbacks.progress_log.RichProgressBar",
    "mate_cli.lit_modules.throughput.Throughput": "mate_cli.callbacks.throughput.Throughput",
}


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every node of a plain config, containers included, parents before their children."""
    if path:
        yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


def walk_targets(node: Any) -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every ``_target_`` in a plain config, whatever its value."""
    return ((key, value) for key, value in walk(node) if key.rsplit(".", 1)[-1] == TARGET)


@functools.lru_cache(maxsize=None)
def allowed_targets(conf_dir: Path = CONF_DIR) -> frozenset[str]:
    found = set()
    for path in sorted(Path(conf_dir).rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            # Hydra's own nodes (hydra.sweeper: its plugins) are never in a run's config
            found.update(v for k, v in walk_targets(document) if isinstance(v, str) and not k.startswith("hydra."))
    return frozenset(found | FORMER_TARGETS)


def current_names(node: Any) -> Any:
    """A plain config with every ``_target_`` of :data:`RENAMED_TARGETS` under its current name."""
    if isinstance(node, dict):
        return {key: RENAMED_TARGETS.get(value, value) if key == TARGET and isinstance(value, str)
                else current_names(value) for key, value in node.items()}  # fmt: skip
    return [current_names(value) for value in node] if isinstance(node, list) else node


def checked_run_config(cfg: DictConfig, source: Path, trust: bool = False) -> DictConfig:
    """``cfg`` resolved, moved targets renamed, once every ``_target_`` is one of :func:`allowed_targets` and no value
    is an interpolation (``trust``: ``cfg`` itself, with a warning); else one ``MateError`` line naming ``source``."""
    try:
        plain = current_names(OmegaConf.to_container(cfg, resolve=True))
    except Exception as err:  # an interpolation that does not resolve: the run dir's file is broken
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise MateError(
            f"{source} does not resolve ({first}); pass a checkpoint whose run dir `mate train` wrote"
        ) from None
    allowed = allowed_targets()
    refused = [(key, f"{value!r} is a target mate_cli's configs never name")
               for key, value in walk_targets(plain) if not (isinstance(value, str) and value in allowed)]  # fmt: skip
    # an escaped interpolation resolves to one, which building would resolve again
    refused += [(key, f"{value!r} is an interpolation, which a resolved run config never holds")
                for key, value in walk(plain) if isinstance(value, str) and "${" in value]  # fmt: skip
    if not refused:
        return OmegaConf.create(plain)
    key, why = refused[0]
    more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
    if trust:
        log.warning("trust_run_config=true: building %s although %s=%s%s", source, key, why, more)
        return cfg
    raise MateError(
        f"{source}: {key}={why}{more}; rebuilding a run instantiates only what mate_cli's configs name "
        "(a run dir is data, not a program): if you wrote this config yourself, pass trust_run_config=true"
    )
