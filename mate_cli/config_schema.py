"""What each config key may hold. A key's type is, first found: ``trainer.<argument>``'s annotation in Lightning's
``Trainer``; :data:`DECLARED` (keys no signature types whose default says nothing); the annotation of the parameter it
fills in its node's ``_target_`` (:mod:`mate_cli.signatures`); its default's type (a string default takes any scalar;
``${other.key}`` takes ``other.key``'s type). So the code's annotations are the config's types;
``tests/conf/test_schema.py`` fails on a key left untyped.
"""

from __future__ import annotations

import re
import typing
from typing import Any, Literal, Mapping, Optional, Union

from mate_cli.signatures import accepts, close_matches, describe, parameters, trainer_parameters, understood


def _keys(names: str, annotation: Any) -> dict[str, Any]:
    return dict.fromkeys(names.split(), annotation)


#: keys whose default does not say their type, or that take more than it, by type
DECLARED: dict[str, Any] = {
    **_keys("ckpt_path init_from paper_name reference passages main_metric stage1.ckpt_path", Optional[str]),
    **_keys("stage2.ckpt_path dataset.sources.hybridqa dataset.sources.sqa dataset.sources.tabfact", Optional[str]),
    **_keys("dataset.sources.wtq dataset.sources.jsonl", Optional[str]),
    # names and paths a logger, a callback or Hydra takes as they are (a number would fail there)
    **_keys("experiment_name run_name table model.encoder.pretrained logger.wandb.group logger.wandb.job_type", str),
    **_keys("logger.wandb.save_dir logger.csv.save_dir paths.root_dir paths.data_dir paths.cache_dir", str),
    "paths.output_dir": str,
    "question": Union[str, int, float, bool],  # text: `question=1999` is the question "1999"
    **_keys("limit_questions bench.threads model.head.max_num_rows model.head.max_num_columns", Optional[int]),
    **_keys("model.dot callbacks.best_checkpoint", Optional[dict]),  # best_checkpoint: null under debug=overfit
    **_keys("metrics logger.wandb.tags", Optional[list]),
    "path": Union[str, list],
    "keep_best": Literal["checkpoint", "encoder"],
}

#: a default that is one interpolation of another key, ``${dataset.max_length}``
_REFERENCE = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")

#: a value lookups did not find
ABSENT = object()

#: the type of a key whose default says nothing and that has no declaration
UNTYPED = Any

#: the commands whose ``trainer`` node goes to Lightning's Trainer
TRAINER_COMMANDS = ("train", "pretrain", "eval", "pointr", "predict")


def lookup(tree: Any, key: str) -> Any:
    """The value at dotted ``key`` of a plain (unresolved) container, else `ABSENT`."""
    node = tree
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return ABSENT
    return node


def dotted_keys(tree: Any, prefix: str = "") -> list[str]:
    """Every dotted key of a plain container (mappings only), parents before children."""
    keys = []
    if isinstance(tree, Mapping):
        for name, value in tree.items():
            key = f"{prefix}{name}"
            keys.append(key)
            keys.extend(dotted_keys(value, key + "."))
    return keys


def says_nothing(default: Any) -> bool:
    """null, ``???``, or an interpolation through a resolver (``${oc.select:...}``): no type."""
    if default is None or default == "???":
        return True
    return (
        isinstance(default, str)
        and default.startswith("${")
        and default.endswith("}")
        and not _REFERENCE.match(default)
    )


def key_type(tree: Any, key: str, command: str | None = None, _seen: frozenset = frozenset()) -> Any:
    """The type ``key`` takes in the composed config ``tree`` (see the module docstring)."""
    if command in TRAINER_COMMANDS and key.startswith("trainer.") and key.count(".") == 1:
        return trainer_parameters().get(key.split(".", 1)[1], UNTYPED)
    if key in DECLARED:
        return DECLARED[key]
    parent, _, name = key.rpartition(".")
    target = lookup(tree, f"{parent}._target_" if parent else "_target_")
    annotation = (parameters(target) or {}).get(name) if isinstance(target, str) else None
    if annotation is not None and understood(annotation):
        return annotation
    default = lookup(tree, key)
    reference = _REFERENCE.match(default) if isinstance(default, str) else None
    if reference and reference.group(1) not in _seen:
        return key_type(tree, reference.group(1), command, _seen | {key})
    if isinstance(default, str) and "${" in default and not says_nothing(default):
        return str  # text around an interpolation: a path or a name
    return type_of_default(default)


def type_of_default(default: Any) -> Any:
    if default is ABSENT or says_nothing(default):
        return UNTYPED
    if isinstance(default, bool):
        return bool
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    if isinstance(default, str):
        return Union[str, int, float, bool]
    if isinstance(default, Mapping):
        return Optional[dict]
    if isinstance(default, list):
        return list
    return UNTYPED


def type_problem(key: str, value: Any, expected: Any, default: Any = ABSENT) -> str | None:
    """The one-line reason ``key=value`` does not fit ``expected``, else None; an interpolation fits anything."""
    if isinstance(value, str) and "${" in value:
        return None
    if accepts(expected, value) is not False:
        return None
    shown = "null" if value is None else value
    wanted = describe(expected).replace("str | int | float | bool", "str")
    plain = default is not ABSENT and not says_nothing(default) and not isinstance(default, (Mapping, list))
    plain = plain and not (isinstance(default, str) and "${" in default)
    example = f"; its default is {key}={default}" if plain else ""
    return f"{key}={shown} has the wrong type: {key} takes {wanted}{example}"


def unknown_key(key: str, tree: Any, where: str, extra: typing.Iterable[str] = ()) -> str:
    """The one line for ``key`` missing from ``tree``, with the closest keys (beside it first)."""
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    candidates = [k for k in dict.fromkeys([*dotted_keys(tree), *extra]) if not k.rsplit(".", 1)[-1].startswith("_")]
    siblings = [k for k in candidates if (k.rsplit(".", 1)[0] if "." in k else "") == parent]
    close = close_matches(key, siblings) or ([] if parent else close_matches(key, candidates))
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    owner = f"`{parent}`" if parent and lookup(tree, parent) is not ABSENT else where
    return f"{key} is not a key of {owner}{hint}"
