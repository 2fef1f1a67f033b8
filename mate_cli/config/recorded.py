"""Options added to mate_cli's models after runs were trained without them, each with the value those runs had, so that
a rebuilt run (``mate eval``, ``mate predict``, PointR) computes the function its weights learned, and an override of
such an option names a key the rebuilt config has. No torch: the command-line check (:mod:`mate_cli.config.check`)
applies it too."""

from __future__ import annotations

from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf, open_dict

#: ``{_target_: {key: the value runs without the key had}}``; a dotted key names a key of a sub-node of the
#: target's node
RECORDED_BEFORE: dict[str, dict[str, Any]] = {
    # runs without global_rows: only the query set of the bucketed global part has dense rows
    "mate_cli.modeling.attention.mate.MateAttention": {"global_rows": "query"},
    # runs without at_least_one_cell: the table tasks decode TAPAS's way only, the cells above 0.5
    "mate_cli.lit_modules.table_qa.TableQAModule": {"head.at_least_one_cell": False},
}


def add_recorded_options(cfg: DictConfig, added: Callable[[str, Any], None] | None = None) -> None:
    """Each node of ``cfg`` whose ``_target_`` is in :data:`RECORDED_BEFORE` gets the recorded value of each key it
    lacks (in place; a dotted key only where its sub-node exists); ``added(key, value)`` is called for each."""
    nodes = [cfg]
    while nodes:
        node = nodes.pop()
        target = OmegaConf.select(node, "_target_", default=None, throw_on_resolution_failure=False)
        for key, value in RECORDED_BEFORE.get(target, {}).items() if isinstance(target, str) else ():
            parent_key, _, leaf = key.rpartition(".")
            parent = (
                OmegaConf.select(node, parent_key, default=None, throw_on_resolution_failure=False)
                if parent_key
                else node
            )
            if isinstance(parent, DictConfig) and leaf not in parent:
                with open_dict(parent):
                    parent[leaf] = value
                if added is not None:
                    added(key, value)
        nodes.extend(v for _, v in node.items_ex(resolve=False) if isinstance(v, DictConfig))
