"""``trainer.*`` checked against Lightning's own ``Trainer`` signature, before anything is built.

A misspelt key or a value of the wrong type (``trainer.max_steps=abc``) is one
`MateError` line naming the key, not a traceback after the data was preprocessed.
Types are read from ``Trainer.__init__``'s annotations; an annotation this check does
not understand accepts any value (Lightning then has the last word).
"""

from __future__ import annotations

import inspect
import types
import typing
from functools import lru_cache
from typing import Any, Mapping

import lightning as L

from mate_cli.errors import MateError


@lru_cache(maxsize=1)
def trainer_parameters() -> dict[str, Any]:
    """``{argument: annotation}`` of ``lightning.Trainer.__init__``."""
    hints = typing.get_type_hints(L.Trainer.__init__)
    names = [n for n in inspect.signature(L.Trainer.__init__).parameters if n != "self"]
    return {name: hints.get(name, Any) for name in names}


def _accepts(annotation: Any, value: Any) -> bool | None:
    """True/False when ``value`` fits ``annotation``; None when the annotation is not understood."""
    if annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        answers = [_accepts(arg, value) for arg in typing.get_args(annotation)]
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


def _describe(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("NoneType", "None")


def check_trainer_args(args: Mapping[str, Any], reserved: tuple[str, ...] = ()) -> dict[str, Any]:
    """``args`` unchanged when every key is a ``Trainer`` argument of a fitting type, else `MateError`.

    ``reserved``: arguments the command passes itself (``mate train``: callbacks, logger,
    plugins, which come from their config groups).
    """
    params = trainer_parameters()
    for key, value in args.items():
        if key in reserved:
            raise MateError(f"trainer.{key} is set by mate itself; use the `{key}` config group instead")
        if key not in params:
            close = [p for p in params if p.startswith(key[:4])][:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise MateError(f"trainer.{key} is not a Lightning Trainer argument{hint}; see `lightning.Trainer` for the list")
        if _accepts(params[key], value) is False:
            raise MateError(
                f"trainer.{key}={value!r} has the wrong type: Lightning's Trainer expects {_describe(params[key])}; "
                f"set trainer.{key}=<value of that type>"
            )
    return dict(args)
