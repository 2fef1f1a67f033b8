"""YAML from run dirs (shared like data, so possibly crafted or broken), read as data with limits.

:func:`read_yaml` reads as ``OmegaConf.load`` would and refuses in one ``MateError`` line naming the file (and
line:column): a file over :data:`MAX_BYTES`; any anchor or alias (no alias bombs); any explicit tag
(``!!python/object``); nesting deeper than :data:`MAX_DEPTH`; malformed YAML; and, unless ``interpolations``
(``trust_run_config=true``), any ``${...}``, so no resolver runs on the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf._utils import get_yaml_loader

from mate_cli.errors import MateError
from mate_cli.config.run_targets import current_names, walk

#: the largest run-dir YAML file read, in bytes
MAX_BYTES = 1_000_000
#: the deepest nesting of lists and mappings read
MAX_DEPTH = 64


class _DataLoader(get_yaml_loader()):  # OmegaConf.load's own rules: 1e-3 a float, no dates, no duplicate keys
    """OmegaConf's YAML loader without anchors, aliases, explicit tags and deep nesting."""

    depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()

        def refused(problem: str) -> yaml.composer.ComposerError:
            return yaml.composer.ComposerError(None, None, problem, event.start_mark)

        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise refused("an anchor or alias (&name / *name), which a run config never holds")
        if getattr(event, "tag", None) is not None:  # the parser sets a tag only where the file writes one
            raise refused(f"the tag {event.tag.replace('tag:yaml.org,2002:', '!!', 1)}, which a run config never holds")
        if self.depth >= MAX_DEPTH:
            raise refused(f"lists and mappings nested more than {MAX_DEPTH} deep")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def read_yaml(path: str | Path, fix: str, interpolations: bool = False, lift: str = "") -> Any:
    """The plain data of ``path``; ``fix`` ends every refusal, ``lift`` (what lifts it) the interpolation refusal."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise MateError(f"{path} is {size:,} bytes, more than a run config's {MAX_BYTES:,}; {fix}")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:  # grown since, or a file whose size says nothing
            raise MateError(f"{path} is more than a run config's {MAX_BYTES:,} bytes; {fix}")
        data = yaml.load(raw.decode("utf-8"), Loader=_DataLoader)  # noqa: S506 - a safe loader, see above
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        reason = " ".join(str(getattr(err, "problem", None) or err).split())
        raise MateError(f"{path}{where}: {reason}; {fix}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise MateError(f"{path} cannot be read ({type(err).__name__}: {err}); {fix}") from None
    if not interpolations:
        found = next((key for key, value in walk(data) if isinstance(value, str) and "${" in value), None)
        if found is not None:
            raise MateError(
                f"{path}: {found} holds an interpolation (${{...}}), which a resolved run config never "
                f"holds, so it is not resolved; {fix}{lift}"
            )
    return data


def read_run_config(path: str | Path, fix: str, interpolations: bool = False, lift: str = "") -> DictConfig:
    """:func:`read_yaml`'s data as an unresolved DictConfig, each ``_target_`` under its current name
    (:data:`~mate_cli.config.run_targets.RENAMED_TARGETS`); one ``MateError`` line unless it is a mapping of keys."""
    data = read_yaml(path, fix, interpolations, lift)
    if not isinstance(data, dict):
        held = f"a YAML {type(data).__name__}" if data is not None else "nothing"
        raise MateError(f"{path} holds {held}, not a mapping of config keys; {fix}")
    try:
        return OmegaConf.create(current_names(data))
    except Exception as err:  # noqa: BLE001 - a key or value OmegaConf refuses (a null or list key, ...)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise MateError(f"{path} is not a config ({first}); {fix}") from None
