"""The command line checked before anything loads: ``mate <command> <overrides>`` is composed with Hydra's compose
API (no torch, no Lightning, no run dir), and every override, each value of a sweep and each option of a swept group,
is checked against :mod:`mate_cli.config.schema`, as are the dotlists that patch a trained run's config
(``overrides=[...]``). The first problem is one line; ``mate`` prints it and exits with status 2."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from mate_cli.config.hydra_args import COMPLETION_FLAGS, CONFIG_CHOICE_FLAGS, HELP_FLAGS, INFO_FLAGS, hydra_value
from mate_cli.config.recorded import add_recorded_options
from mate_cli.config.schema import ABSENT, TRAINER_RESERVED, key_type, lookup, trainer_argument, trainer_problem
from mate_cli.config.schema import range_problem, type_problem, unknown_key
from mate_cli.errors import MateError
from mate_cli.paths import CONF_DIR
from mate_cli.config.run_targets import current_names
from mate_cli.config.yaml_data import read_yaml

#: flags after which Hydra answers without running the task (help, completion, info), and flags that change which
#: config is composed: the check leaves such a command line to Hydra
LEFT_TO_HYDRA = (*HELP_FLAGS, *INFO_FLAGS, *COMPLETION_FLAGS, *CONFIG_CHOICE_FLAGS)

#: the nodes of a command's config whose ``overrides`` patch the run of their ``ckpt_path``
RUN_PATCHES = ("", "stage1", "stage2")


def check_command_line(command: str, args: Sequence[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The one-line problem with ``mate <command> <args>``'s overrides, else None."""
    if any(arg.split("=")[0] in LEFT_TO_HYDRA for arg in args) or not (conf_dir / f"{command}.yaml").is_file():
        return None
    try:
        overrides = _parse([arg for arg in args if not arg.startswith("-") and ("=" in arg or arg.startswith("~"))])
        values = [o for o in overrides if not _chooses(o, conf_dir)]
        variants = list(_group_variants([o for o in overrides if _chooses(o, conf_dir)], conf_dir))
        for i, variant in enumerate(variants):
            context = "" if i == 0 else f"with {' '.join(set(variant) - set(variants[0]))}: "
            try:
                tree = _compose(command, variant, conf_dir)
                for override in values:
                    _check_value_override(command, override, tree, conf_dir)
                if any(_needs_values(override) for override in values):  # what only the composed values show
                    first = trainer_overrides(command, [_first(override, conf_dir) for override in values])
                    tree = _compose(command, variant + first, conf_dir)
                check_run_patches(tree)
            except NoSuchOption:
                raise
            except MateError as err:
                raise MateError(f"{context}{err}") from None
    except MateError as err:
        return str(err)
    return None


class NoSuchOption(MateError):
    """A group option that does not exist: its line names the option, so no sweep context goes before it."""


# ------------------------------------------------------------------ parsing and composing
def trainer_overrides(command: str, args: list[str]) -> list[str]:
    """``trainer.<arg>=v`` -> ``++trainer.<arg>=v``: any (checked) Trainer argument, in the yaml or not."""
    return [
        "++" + arg if "=" in arg and trainer_argument(command, arg.partition("=")[0]) is not None else arg
        for arg in args
    ]


def _parse(texts: Sequence[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed = []
    for text in texts:
        try:
            parsed.extend(parser.parse_overrides([text]))
        except OverrideParseException as err:
            reason = str(err).splitlines()[0]
            key, _, value = text.partition("=")
            if re.fullmatch(r"(?:\w+\()*\s*(?:choice|glob)\(\s*\)[\s)]*", value):  # Hydra's grammar wants an item
                raise _sweeps_nothing(text) from None
            listed = value.startswith("[") and "=" in value
            example = f"{key}=['{value.strip('[]').split(',')[0]}']" if listed else f"{key}='{value}'"
            raise MateError(
                f"cannot parse the override {text!r} ({reason}); quote a value holding spaces, "
                f"and list items holding = or , (e.g. {example}; Hydra's override grammar)"
            ) from None
    return parsed


def parsed_value(text: str) -> Any:
    """The value of the override ``text`` as Hydra reads it (a quoted string unquoted, its escapes undone)."""
    return _parse([text])[0].value()


def _chooses(override, conf_dir: Path) -> bool:
    """Whether ``override`` chooses a config (a group's option, or Hydra's own settings) rather than sets a value."""
    return (conf_dir / override.key_or_group).is_dir() or override.key_or_group.startswith("hydra")


def _options(group: str, conf_dir: Path) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def _values(override, conf_dir: Path) -> list[Any]:
    """Every value an override gives: one, each of its sweep, or an interval's two ends."""
    from hydra.core.override_parser.types import Glob

    value = override.value()
    if isinstance(value, Glob):
        values = value.filter(_options(override.key_or_group, conf_dir))
    elif override.is_discrete_sweep():
        values = [getattr(v, "text", v) for v in override.sweep_iterator()]  # a QuotedString 'a b' -> a b
    elif override.is_sweep_override():
        return [value.start, value.end]
    else:
        return [value]
    if not values:
        raise _sweeps_nothing(override.input_line)
    return values


def _sweeps_nothing(text: str) -> MateError:
    """The error for a sweep of no value (``seed=range(0,0)``, ``seed=choice()``): no job would run."""
    return MateError(
        f"{text} sweeps no value, so there would be no job to run; give it at least one "
        "(e.g. seed=range(0,3) runs 0, 1, 2)"
    )


def _text(override, value: Any) -> str:
    """``override`` with one ``value`` (a sweep's element) as an override string."""
    if override.is_delete():
        return override.get_key_element()
    if value is None:
        shown = "null"
    elif isinstance(value, bool):
        shown = str(value).lower()
    elif isinstance(value, str):
        shown = hydra_value(value)
    else:
        shown = repr(value)
    return f"{override.get_key_element()}={shown}"


def _first(override, conf_dir: Path) -> str:
    """``override`` as the first job gets it: a sweep at its first value."""
    return _text(override, _values(override, conf_dir)[0]) if override.is_sweep_override() else override.input_line


def _group_variants(groups: list, conf_dir: Path) -> Iterator[list[str]]:
    """The group overrides to compose: every group at its first value, then each swept group's other options."""
    first = [_first(override, conf_dir) for override in groups]
    yield first
    for i, override in enumerate(groups):
        for value in _values(override, conf_dir)[1:] if override.is_sweep_override() else []:
            yield first[:i] + [_text(override, value)] + first[i + 1 :]


def _compose(command: str, overrides: list[str], conf_dir: Path) -> dict:
    """The command's config with ``overrides``, as a plain unresolved container."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import MissingConfigException
    from omegaconf import OmegaConf

    from mate_cli.config.naming import register_resolvers

    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name=command):
            cfg = compose(config_name=command, overrides=overrides)
    except MissingConfigException as err:  # Hydra lists a group's options over several lines: one line here
        group, _, choice = (err.missing_cfg_file or "").rpartition("/")
        if not group or not err.options:
            raise MateError(f"{str(err).splitlines()[0]}; see `mate {command} --help` for the config groups") from None
        keys = [o.partition("=")[0] for o in overrides]
        typed = [key for key in keys if key.lstrip("+~").split("@")[0].replace(".", "/") == group]
        raise NoSuchOption(
            f"{typed[0] if typed else group}={choice} is not a config option; choose one of: {', '.join(err.options)}"
        ) from None
    except Exception as err:  # noqa: BLE001 - Hydra's composition errors, several kinds, several lines
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        multiple = r"Multiple values for ([\w/.]+)\. To override a value use 'override \1: (\S+)'"
        if group := re.match(multiple, lines[0] if lines else ""):  # +debug=overfit where the defaults hold a debug
            raise MateError(
                f"+{group[1]}={group[2]}: {group[1]} is already in `mate {command}`'s defaults; "
                f"choose it with {group[1]}={group[2]} (no +)"
            ) from None
        raise MateError(
            f"{' '.join(lines[:2]) or type(err).__name__}; see `mate {command} --help` "
            f"for the config groups and `mate {command} --cfg job` for the keys"
        ) from None
    finally:
        GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg, resolve=False)


# ------------------------------------------------------------------ checking
def _check_value_override(command: str, override, tree: Mapping, conf_dir: Path) -> None:
    key = override.key_or_group
    default = lookup(tree, key)
    argument = trainer_argument(command, key)
    reserved = TRAINER_RESERVED if command in ("train", "pretrain") else ()
    if argument is not None and (problem := trainer_problem(argument, reserved=reserved)):
        raise MateError(problem)
    if default is ABSENT and argument is None:
        if override.is_add() or override.is_force_add():  # +key= / ++key=: a key the user adds on purpose
            return
        groups = [p.name for p in conf_dir.iterdir() if p.is_dir() and p.name != "hydra"] if "." not in key else []
        raise MateError(
            f"{override.input_line}: {unknown_key(key, tree, f'`mate {command}`', groups)} "
            f"(`mate {command} --cfg job` prints the keys)"
        )
    if override.is_add() and default is not ABSENT:
        raise MateError(f"{override.input_line}: {key} is already set; change it with {key}=<value> (no +)")
    if override.is_delete():
        return
    group = key.replace(".", "/")
    if "." in key and (conf_dir / group).is_dir():
        raise MateError(
            f"{override.input_line}: {key} is a config group; choose its option with "
            f"{group}=<{'|'.join(_options(group, conf_dir))}>"
        )
    expected = key_type(tree, key, command)
    for value in _values(override, conf_dir):
        if problem := type_problem(key, value, expected, default) or range_problem(key, value):
            raise MateError(problem)


def _needs_values(override) -> bool:
    """Whether ``override`` sets what :func:`check_run_patches` reads (a ``ckpt_path``, an ``overrides`` list or a
    node holding them) or deletes a key (Hydra checks a deleted value): then the values are composed too."""
    return override.is_delete() or override.key_or_group.split(".")[0] in ("ckpt_path", "overrides", *RUN_PATCHES[1:])


def check_run_patches(tree: Mapping) -> None:
    """Each ``overrides`` list beside a ``ckpt_path`` checked against that run's config."""
    for node_key in RUN_PATCHES:
        node = lookup(tree, node_key) if node_key else tree
        if not isinstance(node, Mapping) or not node.get("overrides"):
            continue
        ckpt = node.get("ckpt_path")
        if not isinstance(ckpt, str) or ckpt == "???" or "${" in ckpt:
            continue
        run_dir = Path(ckpt).expanduser()  # a run dir (its best checkpoint) or <run dir>/checkpoints/<name>.ckpt
        config = (run_dir if run_dir.is_dir() else run_dir.resolve().parent.parent) / "resolved_config.yaml"
        try:
            run = read_yaml(config, "", interpolations=True)
        except MateError:  # a missing or unreadable run config: the command names it itself
            continue
        run = with_recorded_options(current_names(run))
        check_dotlist(run, list(node["overrides"]), f"{node_key + '.' if node_key else ''}overrides", config)


def with_recorded_options(run: Mapping) -> Mapping:
    """``run`` with the options added since it was trained, as its rebuild gives it them
    (:mod:`mate_cli.config.recorded`): an override of one names a key the rebuilt config has. ``run`` unchanged where it
    is no mapping OmegaConf takes (the rebuild names the problem)."""
    from omegaconf import OmegaConf

    try:
        tree = OmegaConf.create(dict(run))
        add_recorded_options(tree)
        return OmegaConf.to_container(tree, resolve=False)
    except Exception:  # noqa: BLE001 - a run config the rebuild itself refuses in one line
        return run


def check_dotlist(run: Mapping, dotlist: Sequence[str], where: str, config: Path) -> None:
    """`MateError` unless each ``key=value`` names a key of the run config ``run`` with a value of its type."""
    from omegaconf import OmegaConf

    for entry in dotlist:
        text = str(entry)
        key, sep, _ = text.partition("=")
        if not sep:
            raise MateError(f"{where}: {text!r} is not key=value; write e.g. {where}=[dataset.eval_batch_size=2]")
        try:
            value = lookup(OmegaConf.to_container(OmegaConf.from_dotlist([text])), key)
        except Exception as err:  # noqa: BLE001 - OmegaConf's parse errors
            raise MateError(f"{where}: cannot parse {text!r} ({str(err).splitlines()[0]})") from None
        if lookup(run, key) is ABSENT:
            raise MateError(f"{where}: {text}: {unknown_key(key, run, f'the run config {config}')}")
        if problem := type_problem(key, value, key_type(run, key), lookup(run, key)):
            raise MateError(f"{where}: {problem}")
