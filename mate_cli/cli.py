"""`mate <command> [hydra overrides]`: one Hydra app per command.

``mate --help`` lists the commands; ``mate <command> --help`` shows Hydra's help
with the config groups; ``mate <command> --cfg job`` prints the composed config.
Errors users can cause (`MateError`) print one line and exit with status 2.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

from mate_cli.paths import CONF_DIR

COMMANDS = {
    "train": ("mate_cli.commands.train", "fit a model (Hydra app, conf/train.yaml)"),
    "eval": ("mate_cli.commands.eval", "evaluate a checkpoint (conf/eval.yaml)"),
    "pointr": ("mate_cli.commands.pointr", "PointR end to end: cell selection, then the reader (conf/pointr.yaml)"),
    "predict": ("mate_cli.commands.predict", "answer one question about one table (conf/predict.yaml)"),
    "bench": ("mate_cli.commands.bench", "time/memory/FLOPs of attention backends (conf/bench.yaml)"),
}

USAGE = """usage: mate <command> [overrides...] [--help] [-m]

Transformers over large tables: MATE, PointR and baselines, driven by Hydra configs.

commands:
{commands}

examples:
  mate train experiment=hybridqa_mate
  mate train -m experiment=hybridqa_mate attention=mate,dense seed=1,2
  mate eval ckpt_path=outputs/train/<run>/checkpoints/last.ckpt
"""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = "\n".join(f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items())
    return USAGE.format(commands=lines)


#: ``mate predict`` arguments that are free text, quoted for Hydra as the user typed them
FREE_TEXT = {"predict": ("question",)}


def hydra_quote(text: str) -> str:
    """``text`` as a single-quoted Hydra value that parses back to ``text`` exactly.

    Hydra keeps backslashes unless they precede a quote or end the string; ``${`` would
    be an OmegaConf interpolation, so it is escaped too.
    """
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return "'" + text.replace("${", "\\${") + "'"


def quote_free_text(command: str, args: list[str]) -> list[str]:
    """``question=What's 1,000?`` -> ``question='What\\'s 1,000?'`` (already quoted values are kept)."""
    keys = FREE_TEXT.get(command, ())
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
        out.append(f"{key}={hydra_quote(value)}" if sep and key in keys and not quoted else arg)
    return out


#: commands whose ``trainer.*`` goes to Lightning's Trainer
TRAINER_COMMANDS = ("train", "eval", "pointr", "predict")


def trainer_overrides(command: str, args: list[str]) -> tuple[list[str], str | None]:
    """``trainer.<arg>=v`` -> ``++trainer.<arg>=v`` for any Lightning Trainer argument (set in
    the yaml or not); a key that is no Trainer argument is the returned one-line error."""
    if command not in TRAINER_COMMANDS:
        return args, None
    from mate_cli.trainer_args import trainer_parameters  # imports lightning: only for these commands

    out = []
    for arg in args:
        key, sep, _ = arg.partition("=")
        if sep and key.startswith("trainer.") and key.count(".") == 1:
            name = key.split(".", 1)[1]
            if name not in trainer_parameters():
                close = [p for p in trainer_parameters() if p.startswith(name[:4])][:3]
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                return args, f"{key} is not a Lightning Trainer argument{hint}; see `lightning.Trainer` for the list"
            arg = "++" + arg
        out.append(arg)
    return out, None


def check_group_choices(args: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The one-line error for ``group=option`` naming an option that does not exist, else None."""
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, _, value = arg.partition("=")
        group = key.lstrip("+~").split("@")[0].replace(".", "/")
        folder = conf_dir / group
        if not folder.is_dir() or value in ("", "null"):
            continue
        options = sorted(p.stem for p in folder.glob("*.yaml"))
        for choice in value.split(","):
            if choice not in options:
                return f"{key}={choice} is not a config option; choose one of: {', '.join(options)}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"mate: error: unknown command '{command}'; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    rest, problem = trainer_overrides(command, rest)
    problem = problem or check_group_choices(rest)
    if problem:
        print(f"mate: error: {problem}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    sys.argv = [f"mate-{command}", *quote_free_text(command, rest)]
    module.main()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
