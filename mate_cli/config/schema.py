"""What each config key may hold. A key's type is, first found: ``trainer.<argument>``'s annotation in Lightning's
``Trainer``; :data:`DECLARED` (keys no signature types whose default says nothing); the annotation of the parameter it
fills in its node's ``_target_``; its default's type (a string default takes any scalar; ``${other.key}`` takes
``other.key``'s type). So the code's annotations are the config's types; ``tests/conf/test_schema.py`` fails on a key
left untyped.

Annotations are read from the installed source, parsed, not imported, so the command line is checked before torch and
Lightning load (docs/architecture.md, "Folder map"). An annotation with a part this reader does not understand is
``Any``, which says nothing: a Trainer argument then takes any value (Lightning has the last word), a ``_target_``'s
parameter its default's type.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import re
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Optional, Union

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
    "path": Union[str, list],
    "keep_best": Literal["checkpoint", "encoder"],
}

ABSENT = object()  #: a value lookups did not find
UNTYPED = Any  #: the type of a key whose default says nothing and that has no declaration
TRAINER = "lightning.pytorch.trainer.trainer.Trainer"
TRAINER_COMMANDS = ("train", "pretrain", "eval", "pointr", "predict")  #: their ``trainer`` node goes to the Trainer
TRAINER_RESERVED = ("callbacks", "logger", "plugins")  #: what `mate train`/`pretrain` build from their config groups
REFERENCE = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")  #: a default that is one interpolation of another key

#: the typing form of each annotation name this reader understands (a container's item types are dropped)
_NAMES = {t.__name__: t for t in (int, float, str, bool, list, dict, tuple)}
_NAMES.update(List=list, Dict=dict, Tuple=tuple, Sequence=list, Mapping=dict, Any=Any)
_NAMES["None"] = type(None)  # a None constant

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
    """``<argument>`` of a ``trainer.<argument>`` key of a command whose ``trainer`` node goes to Lightning's Trainer."""
    trainer_key = command in TRAINER_COMMANDS and key.startswith("trainer.") and key.count(".") == 1
    return key.split(".", 1)[1] if trainer_key else None


def key_type(tree: Any, key: str, command: str | None = None, _seen: frozenset = frozenset()) -> Any:
    """The type ``key`` takes in the composed config ``tree`` (see the module docstring)."""
    argument = trainer_argument(command, key)
    if argument is not None:
        return trainer_parameters().get(argument, UNTYPED)
    if key in DECLARED:
        return DECLARED[key]
    parent, _, name = key.rpartition(".")
    target = lookup(tree, f"{parent}._target_" if parent else "_target_")
    annotation = (parameters(target) or {}).get(name, Any) if isinstance(target, str) else Any
    if annotation is not Any:
        return annotation
    default = lookup(tree, key)
    reference = REFERENCE.match(default) if isinstance(default, str) else None
    if reference and reference.group(1) not in _seen:
        return key_type(tree, reference.group(1), command, _seen | {key})
    if isinstance(default, str) and "${" in default and not says_nothing(default):
        return str  # text around an interpolation: a path or a name
    return type_of_default(default)


def type_of_default(default: Any) -> Any:
    if default is ABSENT or says_nothing(default):
        return UNTYPED
    return next((given for plain, given in _DEFAULT_TYPES if isinstance(default, plain)), UNTYPED)


# ------------------------------------------------------------------ annotations, read from source
def _union(args: list) -> Any:
    return Any if Any in args else Union[tuple(args)]


def annotation_type(node: ast.expr | None) -> Any:
    """The typing form of a parsed annotation: builtins, ``Optional``, ``Union``, ``X | Y``, ``Literal`` and
    containers (their item types dropped); ``Any`` for anything else, and for a union with such a part."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        try:
            return annotation_type(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return Any
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([annotation_type(node.left), annotation_type(node.right)])
    head, items = (node.value, node.slice) if isinstance(node, ast.Subscript) else (node, None)
    name = "None" if isinstance(head, ast.Constant) and head.value is None else getattr(head, "id", None)
    items = items.elts if isinstance(items, ast.Tuple) else [items]
    if name == "Literal" and head is not node:
        return Literal[tuple(item.value for item in items if isinstance(item, ast.Constant))]
    if name in ("Optional", "Union") and head is not node:
        return _union([annotation_type(item) for item in items] + ([type(None)] if name == "Optional" else []))
    return _NAMES.get(name, Any)


def _source(module: str) -> Path | None:
    """The installed file of the dotted ``module`` (``.py`` or a package's ``__init__.py``), not imported."""
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level package: found, not imported
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts[1:])
    return next((file for file in (path.with_suffix(".py"), path / "__init__.py") if file.is_file()), None)


def _definition(module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef | ast.FunctionDef | None]:
    """The module defining ``name`` as seen from ``module`` (following ``from x import name``), and its definition."""
    file = _source(module) if depth < 8 else None
    try:
        body = ast.parse(file.read_text(encoding="utf-8")).body if file else []
    except (OSError, SyntaxError, UnicodeDecodeError):  # unreadable: its keys take their defaults' types
        body = []
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return module, node
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            package = module.split(".")  # a relative import counts from the package: a package's __init__ is its own
            package = package[: len(package) - node.level + (file.name == "__init__.py")] if node.level else []
            return _definition(".".join([*package, *([node.module] if node.module else [])]), original, depth + 1)
    return module, None


@lru_cache(maxsize=None)
def parameters(target: str) -> dict[str, Any] | None:
    """``{argument: annotation}`` of the callable a ``_target_`` names (a class: its ``__init__``, with its bases'
    where it passes ``**kwargs`` on; ``module.Class.method``); None where the source cannot be read."""
    module, _, name = target.rpartition(".")
    module, node = _definition(module, name) if module else (module, None)
    if node is None and "." in module:  # a method
        module, owner = _definition(*module.rsplit(".", 1))
        node = next((n for n in getattr(owner, "body", []) if getattr(n, "name", None) == name), None)
    found: dict[str, Any] = {}
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        for base in (ast.unparse(b) for b in node.bases if init is None or init.args.kwarg):
            found.update(parameters(base if "." in base else f"{module}.{base}") or {})
        node = init
    if isinstance(node, ast.FunctionDef):
        args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        skip = 1 if args and args[0].arg in ("self", "cls") else 0
        found.update({arg.arg: annotation_type(arg.annotation) for arg in args[skip:]})
    return found or None


def trainer_parameters() -> dict[str, Any]:
    found = parameters(TRAINER)
    if found is None:
        raise MateError("lightning's Trainer was not found in its source; run `make install` (or pip install -e .)")
    return found


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
    """Why ``trainer.<name>`` (``=value``, where given) cannot be set: mate sets it itself, ``Trainer`` has no such
    argument, or the value does not fit its annotation; else None."""
    if name in reserved:
        return f"trainer.{name} is set by mate itself; use the `{name}` config group instead"
    params = trainer_parameters()
    if name not in params:
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
    """``args`` unchanged when every key is a ``Trainer`` argument of a fitting type, else `MateError`;
    ``reserved``: arguments the command passes itself."""
    for key, value in args.items():
        problem = trainer_problem(key, value, reserved)
        if problem:
            raise MateError(problem)
    return dict(args)
