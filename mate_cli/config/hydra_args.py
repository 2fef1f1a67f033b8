"""Free text as Hydra override values: quoting that parses back to exactly what was typed; ``mate report``'s bare
folders as its ``path=``."""

from __future__ import annotations

import re
from pathlib import Path

from mate_cli.errors import MateError


#: ``mate predict`` arguments that are free text, quoted for Hydra as the user typed them
FREE_TEXT = {"predict": ("question",)}


def hydra_quote(text: str) -> str:
    """``text`` as a single-quoted Hydra value that parses back to ``text`` exactly (Hydra keeps backslashes unless
    they precede a quote or end the string; ``${``, an interpolation, is escaped)."""
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return "'" + text.replace("${", "\\${") + "'"


#: a value Hydra's grammar takes unquoted (a letter beyond ASCII is a lexer error there, so it needs quotes)
PLAIN_VALUE = re.compile(r"[\w./:+-]+", re.ASCII)


def hydra_value(text: str) -> str:
    """``text`` (a folder, a name) as an override value: as it is where Hydra takes it unquoted, else quoted
    (:func:`hydra_quote`)."""
    return text if PLAIN_VALUE.fullmatch(text) else hydra_quote(text)


def quote_free_text(command: str, args: list[str]) -> list[str]:
    """``question=What's 1,000?`` -> ``question='What\\'s 1,000?'`` (already quoted values are kept)."""
    keys = FREE_TEXT.get(command, ())
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
        out.append(f"{key}={hydra_quote(value)}" if sep and key in keys and not quoted else arg)
    return out


#: Hydra's own flags, by what they do: help; ``--info`` and ``--cfg`` answer with the composed config (the task does
#: not run); shell completion; the flags that choose which config is composed; a sweep
HELP_FLAGS = ("--help", "-h", "--hydra-help")
INFO_FLAGS = ("--info", "-i")
CFG_FLAGS = ("--cfg", "-c")
COMPLETION_FLAGS = ("-sc", "--shell-completion")
CONFIG_CHOICE_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")
MULTIRUN_FLAGS = ("-m", "--multirun")
#: Hydra flags followed by a value (``--info``'s is optional: one of INFO_VALUES)
VALUE_FLAGS = (*CFG_FLAGS, "--package", "-p", *CONFIG_CHOICE_FLAGS, "--experimental-rerun")
INFO_VALUES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def path_argument(args: list[str]) -> list[str]:
    """``mate report``'s arguments with its bare arguments (no ``=``, or an existing path such as a job dir
    ``0-attention=sat,seed=1``; not a flag or its value) as ``path=<dir>`` (one) or ``path=[<dir>,...]`` (several), each
    quoted for Hydra, where the first stood; the same arguments given again come back unchanged."""
    bare = []
    for i, arg in enumerate(args):
        before = args[i - 1] if i else ""
        flag_value = before in VALUE_FLAGS or (before in INFO_FLAGS and arg in INFO_VALUES)
        if not arg.startswith("-") and not flag_value and ("=" not in arg or Path(arg).exists()):
            bare.append(i)
    if not bare:
        return list(args)
    if given := [arg for i, arg in enumerate(args) if i not in bare and arg.lstrip("+~").startswith("path=")]:
        raise MateError(
            f"mate report got folders both bare ({' '.join(args[i] for i in bare)}) and as {given[0]}; "
            "pass them one way: mate report <dir> [<dir> ...], or path=[<dir>,<dir>]"
        )
    folders = [hydra_quote(args[i]) for i in bare]
    value = folders[0] if len(folders) == 1 else f"[{','.join(folders)}]"
    return [f"path={value}" if i == bare[0] else arg for i, arg in enumerate(args) if i == bare[0] or i not in bare]
