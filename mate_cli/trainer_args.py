"""``trainer.*`` checked against Lightning's own ``Trainer`` signature, before anything is built.

A misspelt key or a value of the wrong type (``trainer.max_steps=abc``) is one
`MateError` line naming the key, not a traceback after the data was preprocessed.
Names and types are read from ``Trainer.__init__`` in Lightning's installed source,
parsed, not imported (importing Lightning takes seconds; the command line is checked
before that). An annotation this check does not understand accepts any value
(Lightning then has the last word).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from mate_cli.errors import MateError


#: Trainer arguments `mate train` and `mate pretrain` build from their own config groups
TRAINER_RESERVED = ("callbacks", "logger", "plugins")


class Unknown:
    """An annotation this check does not understand (a Lightning class, a private alias)."""


_BUILTIN_TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "list": list,
    "dict": dict,
    "tuple": tuple,
    "List": list,
    "Dict": dict,
    "Tuple": tuple,
    "Sequence": list,
    "Any": Any,
}


def annotation_type(node: ast.expr | None) -> Any:
    """The typing form of a parsed annotation: builtins, ``Optional``, ``Union``, ``X | Y``,
    ``Literal`` and containers (their item types dropped); anything else is `Unknown`."""
    if node is None:
        return Any
    if isinstance(node, ast.Constant):
        return type(None) if node.value is None else Unknown
    if isinstance(node, ast.Name):
        return _BUILTIN_TYPES.get(node.id, Unknown)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return typing.Union[annotation_type(node.left), annotation_type(node.right)]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        name = node.value.id
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if name == "Literal":
            return typing.Literal[tuple(item.value for item in items if isinstance(item, ast.Constant))]
        if name in ("Optional", "Union"):
            args = [annotation_type(item) for item in items] + ([type(None)] if name == "Optional" else [])
            return typing.Union[tuple(args)]
        return _BUILTIN_TYPES.get(name, Unknown)
    return Unknown


def _trainer_source() -> Path:
    spec = importlib.util.find_spec("lightning")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise MateError("lightning is not installed; run `make install` (or pip install -e .)")
    return Path(list(spec.submodule_search_locations)[0]) / "pytorch" / "trainer" / "trainer.py"


@lru_cache(maxsize=1)
def trainer_parameters() -> dict[str, Any]:
    """``{argument: annotation}`` of ``lightning.Trainer.__init__``, read from its source."""
    tree = ast.parse(_trainer_source().read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Trainer":
            init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
            args = [*init.args.args[1:], *init.args.kwonlyargs]
            return {arg.arg: annotation_type(arg.annotation) for arg in args}
    raise MateError(f"{_trainer_source()} defines no Trainer class; reinstall lightning (pip install -e .)")


def close_matches(name: str, choices, n: int = 3) -> list[str]:
    """Up to ``n`` of ``choices`` spelled like ``name`` (for "did you mean")."""
    return difflib.get_close_matches(name, list(choices), n=n, cutoff=0.6)


def accepts(annotation: Any, value: Any) -> bool | None:
    """True/False when ``value`` fits ``annotation``; None when the annotation is not understood."""
    if annotation is Any:
        return True
    if annotation is Unknown:
        return None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        answers = [accepts(arg, value) for arg in typing.get_args(annotation)]
        return True if any(answers) else (None if None in answers else False)
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple, typing.Sequence) or annotation in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin in (dict, typing.Mapping) or annotation is dict:
        return isinstance(value, Mapping)
    return None


def describe(annotation: Any) -> str:
    """``Optional[int]`` -> ``int | None``; a bare type is its name."""
    if isinstance(annotation, type):
        return "None" if annotation is type(None) else annotation.__name__
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " | ".join(describe(arg) for arg in typing.get_args(annotation))
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(repr(arg) for arg in typing.get_args(annotation))
    return str(annotation).replace("typing.", "")


def trainer_name_problem(name: str, reserved: tuple[str, ...] = ()) -> str | None:
    """Why ``trainer.<name>`` cannot be set (mate sets it itself, or ``Trainer`` has no such argument), else None."""
    if name in reserved:
        return f"trainer.{name} is set by mate itself; use the `{name}` config group instead"
    params = trainer_parameters()
    if name not in params:
        close = close_matches(name, params)
        hint = f" (did you mean {', '.join('trainer.' + c for c in close)}?)" if close else ""
        return f"trainer.{name} is not a Lightning Trainer argument{hint}; see `lightning.Trainer` for the list"
    return None


def check_trainer_args(args: Mapping[str, Any], reserved: tuple[str, ...] = ()) -> dict[str, Any]:
    """``args`` unchanged when every key is a ``Trainer`` argument of a fitting type, else `MateError`;
    ``reserved``: arguments the command passes itself (``mate train``: callbacks, logger, plugins)."""
    params = trainer_parameters()
    for key, value in args.items():
        problem = trainer_name_problem(key, reserved)
        if problem:
            raise MateError(problem)
        if accepts(params[key], value) is False:
            raise MateError(
                f"trainer.{key}={value!r} has the wrong type: Lightning's Trainer expects {describe(params[key])}; "
                f"set trainer.{key}=<value of that type>"
            )
    return dict(args)
