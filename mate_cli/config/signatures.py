"""Writes :mod:`mate_cli.config.parameter_types`: the annotations of Lightning's ``Trainer`` and of every ``_target_``
that ``conf/`` names, read with :func:`inspect.signature` from the imported classes and reduced to the forms the check
understands (builtins, ``None``, ``Literal`` and unions of them; a container loses its item types; any other class is
``Any``, which takes anything). ``make parameter-types`` runs :func:`main`; ``tests/conf/test_schema.py`` fails while
the checked-in table differs from what this writes. The table, not this module, is what ``mate`` reads: the command
line is checked before torch and Lightning load."""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

TABLE = Path(__file__).with_name("parameter_types.py")

#: the plain type each annotation's class stands for (the rest is ``Any``)
_PLAIN = {t: t for t in (bool, int, float, str, list, dict, tuple)}
_PLAIN.update({collections.abc.Sequence: list, collections.abc.Mapping: dict})


def simplify(annotation: Any) -> Any:
    """``annotation`` in the check's forms (see the module docstring)."""
    if annotation is None or annotation is type(None):
        return type(None)
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        parts = [simplify(arg) for arg in typing.get_args(annotation)]
        return Any if Any in parts else Union[tuple(parts)]
    if origin is Literal:
        return annotation
    return _PLAIN.get(origin or annotation, Any)


def _evaluated(annotation: Any, namespace: dict) -> Any:
    """A string annotation (``from __future__ import annotations``) evaluated where it was written; ``Any`` if it
    names what that module only imports for type checkers."""
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, namespace)  # noqa: S307 - the annotations of installed code
    except Exception:  # noqa: BLE001 - a name defined under TYPE_CHECKING only
        return Any


def _own_parameters(function) -> tuple[dict[str, Any], bool]:
    """``({name: type}, takes **kwargs)`` of ``function``, ``self``/``cls`` and ``*args`` left out."""
    found, more = {}, False
    namespace = getattr(inspect.unwrap(function), "__globals__", {})
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind is parameter.VAR_KEYWORD:
            more = True
        elif parameter.kind is not parameter.VAR_POSITIONAL and name not in ("self", "cls"):
            annotation = parameter.annotation
            found[name] = Any if annotation is parameter.empty else simplify(_evaluated(annotation, namespace))
    return found, more


def parameters_of(target: str) -> dict[str, Any]:
    """``{argument: type}`` of the callable ``target`` names: a class's ``__init__``, with its bases' where it passes
    ``**kwargs`` on (the class's own first); a function or a ``Class.method``."""
    from hydra.utils import get_object

    obj = get_object(target)
    if not isinstance(obj, type):
        return _own_parameters(obj)[0]
    found: dict[str, Any] = {}
    for cls in (c for c in obj.__mro__ if "__init__" in vars(c) and c is not object):
        own, more = _own_parameters(vars(cls)["__init__"])
        found.update({name: kind for name, kind in own.items() if name not in found})
        if not more:
            break
    return found


def source(annotation: Any) -> str:
    """``annotation`` (a :func:`simplify` form) as the Python that builds it."""
    if annotation is Any or annotation is type(None):
        return "Any" if annotation is Any else "None"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Union:  # in a fixed order: typing caches equal unions, so their order is whichever came first
        return f"Union[{', '.join(sorted(map(source, args), key=lambda text: (text == 'None', text)))}]"
    if origin is Literal:  # the same: equal literals are cached too
        return f"Literal[{', '.join(sorted(map(repr, args)))}]"
    return annotation.__name__


def _wrapped(head: str, items: list[str], width: int = 120) -> list[str]:
    """``head`` then ``items`` joined by ", ", cut into lines of at most ``width`` (an item longer stays whole)."""
    lines, line = [], head
    for item in items:
        if len(line) + len(item) + 2 > width and line.strip():
            lines.append(line.rstrip())
            line = "        "
        line += item + ", "
    return [*lines, line.rstrip()]


def table() -> dict[str, dict[str, Any]]:
    """``{target: {argument: type}}`` of Lightning's Trainer and every ``_target_`` ``conf/`` names."""
    from mate_cli.config.schema import TRAINER
    from mate_cli.config.run_targets import allowed_targets

    return {target: parameters_of(target) for target in sorted({TRAINER, *allowed_targets()})}


def render(types_by_target: dict[str, dict[str, Any]]) -> str:
    """The text of :mod:`mate_cli.config.parameter_types` holding ``types_by_target`` and the installed Lightning's
    and torch's versions."""
    import lightning
    import torch

    lines = [
        '"""Written by `make parameter-types` (mate_cli/config/signatures.py): the types each `_target_` of conf/ and',
        "Lightning's Trainer take, read from their signatures. Do not edit: tests/conf/test_schema.py fails while it",
        'differs from what that writes."""',
        "",
        "# fmt: off",
        "from typing import Any, Literal, Union  # noqa: F401",
        "",
        f"LIGHTNING = {lightning.__version__!r}  #: the Lightning whose Trainer this describes",
        f"TORCH = {torch.__version__!r}  #: the torch whose optimiser this describes",
        "",
        "PARAMETER_TYPES = {",
    ]
    for target, types_ in types_by_target.items():
        items = [f"{name!r}: {source(kind)}" for name, kind in types_.items()]
        lines += [*_wrapped(f"    {target!r}: {{", items), "    },"]
    return "\n".join([*lines, "}", ""])


def main() -> None:
    TABLE.write_text(render(table()), encoding="utf-8")
    print(f"wrote {TABLE}")


if __name__ == "__main__":
    main()
