"""What each config key may hold. A key's type is, first found: ``trainer.<argument>``'s annotation in Lightning's
``Trainer``; :data:`DECLARED`; the annotation of the parameter it fills in its node's ``_target_``; its default's type
(a string default takes any scalar; ``${other.key}`` takes ``other.key``'s type). So the code's annotations are the
config's types; ``tests/conf/test_schema.py`` fails on a key left untyped.

The annotations come from :mod:`mate_cli.config.parameter_types`, written from the real signatures by
:mod:`mate_cli.config.signatures`, so the command line is checked before torch and Lightning load. An annotation the
table reduces to ``Any`` says nothing: a Trainer argument then takes any value, a ``_target_``'s parameter its
default's type."""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any, Iterable, Literal, Mapping, Optional, Union

from mate_cli.config.parameter_types import LIGHTNING, PARAMETER_TYPES
from mate_cli.errors import MateError


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
    **_keys("profile_steps dataset.pad_to_multiple_of", Optional[int]),
    **_keys("model.dot callbacks.best_checkpoint", Optional[dict]),  # best_checkpoint: null under debug=overfit
    **_keys("metrics logger.wandb.tags", Optional[list]),
    "path": Union[str, list[str]],  # `mate report`'s folder, or folders
    "keep_best": Literal["checkpoint", "encoder"],
}

#: keys whose numbers have a least value (their type lets any whole number through): key -> (least, what it is and
#: how to set it)
AT_LEAST: dict[str, tuple[int, str]] = {
    "profile_steps": (0, "it counts the training steps timed (then as many watched) after 10 warm-up steps; set "
                         "profile_steps=20, say, or null for no profile"),
}  # fmt: skip

ABSENT = object()  #: a value lookups did not find
UNTYPED = Any  #: the type of a key whose default says nothing and that has no declaration
TRAINER = "lightning.pytorch.trainer.trainer.Trainer"
TRAINER_COMMANDS = ("train", "pretrain", "eval", "pointr", "predict")  #: their ``trainer`` node goes to the Trainer
TRAINER_RESERVED = ("callbacks", "logger", "plugins")  #: what `mate train`/`pretrain` build from their config groups
REFERENCE = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")  #: a default that is one interpolation of another key

#: the type a plain default gives its key, first match (a bool is not taken for an int)
_DEFAULT_TYPES = ((bool, bool), (int, int), (float, float), (str, Union[str, int, float, bool]))
_DEFAULT_TYPES += ((Mapping, Optional[dict]), (list, list))

#: what each plain type accepts (a bool is not a number; an int is a float)
_FITS = {bool: bool, int: int, float: (int, float), str: str, list: (list, tuple), tuple: (list, tuple), dict: Mapping}
_FITS[type(None)] = type(None)


# ------------------------------------------------------------------ the config tree
def lookup(tree: Any, key: str) -> Any:
    """The value at dotted ``key`` of a plain (unresolved) container, else `ABSENT`."""
    for part in key.split("."):
        if isinstance(tree, Mapping) and part in tree:
            tree = tree[part]
        elif isinstance(tree, list) and part.isdigit() and int(part) < len(tree):
            tree = tree[int(part)]
        else:
            return ABSENT
    return tree


def dotted_keys(tree: Any, prefix: str = "") -> list[str]:
    """Every dotted key of a plain container (mappings only), parents before children."""
    items = tree.items() if isinstance(tree, Mapping) else ()
    return [key for name, value in items for key in (f"{prefix}{name}", *dotted_keys(value, f"{prefix}{name}."))]


def says_nothing(default: Any) -> bool:
    """null, ``???``, or an interpolation through a resolver (``${oc.select:...}``): no type."""
    resolver = isinstance(default, str) and default.startswith("${") and default.endswith("}")
    return default is None or default == "???" or (resolver and not REFERENCE.match(default))


def trainer_argument(command: str | None, key: str) -> str | None:
    """``<argument>`` of a ``trainer.<argument>`` key of a command whose ``trainer`` node goes to Lightning's Trainer
    (else None)."""
    trainer_key = command in TRAINER_COMMANDS and key.startswith("trainer.") and key.count(".") == 1
    return key.split(".", 1)[1] if trainer_key else None


def key_type(tree: Any, key: str, command: str | None = None, _seen: frozenset = frozenset()) -> Any:
    """The type ``key`` takes in the composed config ``tree`` (see the module docstring)."""
    if (argument := trainer_argument(command, key)) is not None:
        return trainer_parameters().get(argument, UNTYPED)
    if key in DECLARED:
        return DECLARED[key]
    parent, _, name = key.rpartition(".")
    target = lookup(tree, f"{parent}._target_" if parent else "_target_")
    annotation = PARAMETER_TYPES.get(target, {}).get(name, Any) if isinstance(target, str) else Any
    if annotation is not Any:
        return annotation
    default = lookup(tree, key)
    reference = REFERENCE.match(default) if isinstance(default, str) else None
    if reference and reference.group(1) not in _seen:
        return key_type(tree, reference.group(1), command, _seen | {key})
    if isinstance(default, str) and "${" in default and not says_nothing(default):
        return str  # text around an interpolation: a path or a name
    if default is ABSENT or says_nothing(default):
        return UNTYPED
    return next((given for plain, given in _DEFAULT_TYPES if isinstance(default, plain)), UNTYPED)


# ------------------------------------------------------------------ annotations, from the generated table
def trainer_parameters() -> dict[str, Any]:
    return PARAMETER_TYPES[TRAINER]


def lightning_differs() -> bool:
    """Whether the installed Lightning is not the one the table describes: its Trainer may take other arguments."""
    # imported here: a passing check does not pay for it (BENCHMARKS.md, "Command-line check")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lightning") != LIGHTNING
    except PackageNotFoundError:
        return True


# ------------------------------------------------------------------ values against types
def _parts(annotation: Any) -> tuple[Any, tuple]:
    """``(origin, args)``: ``Union`` for ``Optional[X]`` and ``X | Y``, ``Literal``, else the plain type itself."""
    origin = typing.get_origin(annotation)
    return (Union if origin is types.UnionType else origin or annotation), typing.get_args(annotation)


def accepts(annotation: Any, value: Any) -> bool:
    """Whether ``value`` fits ``annotation`` (``Any``, and a type this reader has no check for, take anything)."""
    kind, args = _parts(annotation)
    if kind is Union:
        return any(accepts(arg, value) for arg in args)
    if kind is Literal:
        return value in args
    fits = _FITS.get(kind)
    return fits is None or (isinstance(value, fits) and (kind is bool or not isinstance(value, bool)))


def describe(annotation: Any) -> str:
    """``Optional[int]`` -> ``int | None``; ``Literal['a', 'b']`` -> ``'a' | 'b'``; a bare type is its name."""
    kind, args = _parts(annotation)
    if kind in (Union, Literal):
        return " | ".join(map(describe if kind is Union else repr, args))
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def close_matches(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    return difflib.get_close_matches(name, list(choices), n=n, cutoff=0.6)


def type_problem(key: str, value: Any, expected: Any, default: Any = ABSENT) -> str | None:
    """The one-line reason ``key=value`` does not fit ``expected``, else None; an interpolation fits anything."""
    if (isinstance(value, str) and "${" in value) or accepts(expected, value):
        return None
    wanted = describe(expected).replace("str | int | float | bool", "str")
    plain = default is not ABSENT and not says_nothing(default) and not isinstance(default, (Mapping, list))
    plain = plain and not (isinstance(default, str) and "${" in default)
    example = f"; its default is {key}={default}" if plain else ""
    return f"{key}={'null' if value is None else value} has the wrong type: {key} takes {wanted}{example}"


def range_problem(key: str, value: Any) -> str | None:
    """The one-line reason a number is below ``key``'s least value (:data:`AT_LEAST`), else None."""
    least, fix = AT_LEAST.get(key, (None, ""))
    if least is None or isinstance(value, bool) or not isinstance(value, (int, float)) or value >= least:
        return None
    return f"{key}={value} is below {least}: {fix}"


def unknown_key(key: str, tree: Any, where: str, extra: Iterable[str] = ()) -> str:
    """The one line for ``key`` missing from ``tree``, with the closest keys (beside it first)."""
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    candidates = [k for k in dict.fromkeys([*dotted_keys(tree), *extra]) if not k.rsplit(".", 1)[-1].startswith("_")]
    siblings = [k for k in candidates if (k.rsplit(".", 1)[0] if "." in k else "") == parent]
    close = close_matches(key, siblings) or ([] if parent else close_matches(key, candidates))
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    owner = f"`{parent}`" if parent and lookup(tree, parent) is not ABSENT else where
    return f"{key} is not a key of {owner}{hint}"


# ------------------------------------------------------------------ Lightning's Trainer
def trainer_problem(name: str, value: Any = ABSENT, reserved: tuple[str, ...] = ()) -> str | None:
    """Why ``trainer.<name>`` (``=value``, where given) cannot be set (reserved, unknown, wrong type); else None."""
    if name in reserved:
        return f"trainer.{name} is set by mate itself; use the `{name}` config group instead"
    params = trainer_parameters()
    if name not in params:
        if lightning_differs():  # an argument of a newer Lightning's Trainer: Lightning has the last word
            return None
        close = close_matches(name, params)
        hint = f" (did you mean {', '.join('trainer.' + c for c in close)}?)" if close else ""
        return f"trainer.{name} is not a Lightning Trainer argument{hint}; see `lightning.Trainer` for the list"
    if value is not ABSENT and not accepts(params[name], value):
        return (
            f"trainer.{name}={value!r} has the wrong type: Lightning's Trainer expects {describe(params[name])}; "
            f"set trainer.{name}=<value of that type>"
        )
    return None


def check_trainer_args(args: Mapping[str, Any], reserved: tuple[str, ...] = ()) -> dict[str, Any]:
    """``args`` as a dict once every key is a ``Trainer`` argument of a fitting type, not one of ``reserved``."""
    for key, value in args.items():
        if problem := trainer_problem(key, value, reserved):
            raise MateError(problem)
    return dict(args)
