"""`mate <command> [hydra overrides]`: one Hydra app per command; bad input is one line on stderr and exit status 2."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from mate_cli.config.check import check_command_line, trainer_overrides
from mate_cli.errors import MateError
from mate_cli.config.hydra_args import CFG_FLAGS, COMPLETION_FLAGS, HELP_FLAGS, INFO_FLAGS, MULTIRUN_FLAGS
from mate_cli.config.hydra_args import hydra_value, path_argument, quote_free_text
from mate_cli.paths import keep_tool_caches, output_root
from mate_cli.silenced import silence

#: each command's help line (its module: ``mate_cli.commands.<command>``)
HELP = {
    "train": "fit a model (Hydra app, conf/train.yaml)",
    "pretrain": "masked-LM pre-training on tables, any attention (conf/pretrain.yaml)",
    "synthesize": "synthetic statements about tables, a TabFact dataset to train on first (conf/synthesize.yaml)",
    "eval": "evaluate a checkpoint (conf/eval.yaml)",
    "pointr": "PointR end to end: cell selection, then the reader (conf/pointr.yaml)",
    "predict": "answer one question about one table (conf/predict.yaml)",
    "export": "a trained SQA, WikiTQ or TabFact run as a transformers TAPAS directory (conf/export.yaml)",
    "bench": "time/memory/FLOPs of attention backends (conf/bench.yaml)",
    "baseline": "trivial baselines of SQA, WikiTQ, TabFact: no model (conf/baseline.yaml)",
    "report": "median/half-IQR over seeds per configuration from run dirs (conf/report.yaml)",
}
COMMANDS = {name: (f"mate_cli.commands.{name}", help_) for name, help_ in HELP.items()}

USAGE = """usage: mate <command> [overrides...] [--help] [-m]

Transformers over large tables: MATE, PointR and baselines, driven by Hydra configs.

commands:
{commands}

examples:
  mate train experiment=hybridqa_mate
  mate train -m experiment=hybridqa_mate attention=mate,dense seed=1,2
  mate eval ckpt_path=outputs/train/<run>/checkpoints/last.ckpt

tab completion (bash; e.g. in ~/.bashrc):
  eval "$(mate -sc install=bash)"
"""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = "\n".join(f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items())
    return USAGE.format(commands=lines)


def main(argv: list[str] | None = None) -> int:
    program = sys.argv[0]
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in COMPLETION_FLAGS:
        return shell_completion(argv[1:], None, program)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        return fail(f"unknown command '{command}'; choose one of: {', '.join(COMMANDS)}")
    if any(arg in COMPLETION_FLAGS for arg in rest):
        return shell_completion(rest, command, program)
    try:
        rest = as_hydra_reads(command, rest)
    except MateError as err:
        return fail(str(err))
    rest, problem = checked_command_line(command, rest)
    answer_only = any(arg in NO_TASK_FLAGS for arg in rest)  # no task runs: no run dir to claim or write
    if not problem and not answer_only:
        rest, problem = claim_given_run_dir(command, rest)
        problem = problem or check_output_root(rest)
    if problem:
        return fail(problem)
    keep_tool_caches()
    silence()
    app = answer_only_app(command) if answer_only else importlib.import_module(COMMANDS[command][0]).main
    sweep = not answer_only and any(arg in MULTIRUN_FLAGS for arg in rest)
    if sweep:  # a signal reaches the jobs in other processes once, and the sweep ends in one line (run/sweep.py)
        from mate_cli.run import sweep as sweeps

        sweeps.watch_signals(given_sweep_dir(rest))
    try:
        run_hydra_app(app, program, command, trainer_overrides(command, rest))
    except SystemExit:
        if not (sweep and sweeps.stopped_by()):
            raise
    finally:
        if not answer_only:  # a folder claimed for a run that wrote nothing there (Hydra refused it) is not left behind
            from mate_cli.run import lock as run_lock

            run_lock.remove_unused_claims()
    if sweep and (signum := sweeps.stopped_by()):
        print(sweeps.stopped_line(given_sweep_dir(rest) or "hydra.sweep.dir", signum), file=sys.stderr)
        return 128 + signum
    if sweep and (end := sweeps.end_of_sweep(sweeps.sweep_folder(given_sweep_dir(rest)))):
        print(end[0], file=sys.stderr)  # jobs that ran elsewhere and did not finish
        return end[1]
    return 0


def given_sweep_dir(args: list[str]) -> Path | None:
    """The ``hydra.sweep.dir=`` the (claimed) command line gives, else None (Hydra's own)."""
    given = [arg for arg in args if arg.startswith("hydra.sweep.dir=")]
    return Path(given_folder(given[-1])) if given and "${" not in given[-1] else None


def as_hydra_reads(command: str, args: list[str]) -> list[str]:
    """``args`` as the command's app hands them to Hydra (``mate report``'s bare folder as ``path=...``): what a run
    dir's claim compares with the overrides Hydra recorded there."""
    return path_argument(args) if command == "report" else list(args)


def fail(problem: str) -> int:
    """``problem`` as one line on stderr; the exit status of bad input."""
    print(f"mate: error: {problem}", file=sys.stderr)
    return 2


#: Hydra's flags that print an answer (help, the composed config, its sources) and run no task
NO_TASK_FLAGS = (*HELP_FLAGS, *CFG_FLAGS, *INFO_FLAGS)


def answer_only_app(command: str):
    """``command``'s Hydra app for the flags that run no task, without importing its module (torch, Lightning), so
    ``mate train --help`` and ``--cfg job`` answer in about a second."""
    from mate_cli.commands.common import hydra_app

    def no_task(cfg) -> None:
        raise RuntimeError(f"mate {command}: a task ran for a flag that answers only")

    return hydra_app(COMMANDS[command][0], no_task)


def checked_command_line(command: str, args: list[str]) -> tuple[list[str], str | None]:
    """``args`` with free text quoted for Hydra, and the one-line problem in them, if any."""
    args = quote_free_text(command, list(args))
    return args, check_paths_on_one_line(args) or check_command_line(command, args) or check_one_mode(args)


#: the overrides that name folders mate creates (or whose files it writes)
FOLDER_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir", "paths.", "dataset.cache_dir")


def check_paths_on_one_line(args: list[str]) -> str | None:
    """A folder named with a line break in it, refused before any folder is made (Hydra's parser fails on it later)."""
    for arg in args:
        key, _, value = arg.lstrip("+~").partition("=")
        if key.startswith(FOLDER_KEYS) and ("\n" in value or "\r" in value):
            return f"{key} holds a line break ({value.splitlines()[0]!r}...); name the folder on one line"
    return None


def check_one_mode(args: list[str]) -> str | None:
    """Hydra's modes exclude each other: ``-m`` with ``--cfg`` or ``--info`` (a traceback otherwise)."""
    shown = [arg for arg in args if arg in (*CFG_FLAGS, *INFO_FLAGS)]
    if shown and any(arg in MULTIRUN_FLAGS for arg in args):
        return f"{shown[0]} shows the config of one run: drop -m and give each key one value"
    return None


def claim_given_run_dir(command: str, args: list[str]) -> tuple[list[str], str | None]:
    """Claim the ``hydra.run.dir=`` (``-m``: ``hydra.sweep.dir=``) given, before Hydra writes there
    (:func:`mate_cli.run.lock.claim`): ``(arguments to run, one-line problem or None)``."""
    from mate_cli.run import lock as run_lock

    sweep = any(arg in args for arg in MULTIRUN_FLAGS)
    key = "hydra.sweep.dir=" if sweep else "hydra.run.dir="
    given = [arg for arg in args if arg.startswith(key)]
    if not given or "${" in given[-1]:
        return args, None
    settings = dict(arg.split("=", 1) for arg in args if "=" in arg and not arg.startswith("-"))
    existing = settings.get(run_lock.EXISTING_KEY, "refuse")
    if existing not in run_lock.EXISTING_CHOICES:
        return args, f"{run_lock.EXISTING_KEY}={existing}: choose one of {', '.join(run_lock.EXISTING_CHOICES)}"
    own = run_lock.compared([arg for arg in trainer_overrides(command, args) if not arg.startswith("-")])
    resuming = settings.get("ckpt_path", "null") not in ("", "null")
    try:
        folder = given_folder(given[-1])
        directory = run_lock.claim(folder, command, own, existing, resuming=resuming, sweep=sweep)
    except MateError as err:
        return args, str(err)
    except OSError as err:
        return args, unwritable(Path(folder), err)
    # handed back to Hydra as its grammar reads it: a letter beyond ASCII unquoted is a lexer error there
    return [arg for arg in args if arg not in given] + [f"{key}{hydra_value(str(directory))}"], None


def given_folder(override: str) -> str:
    """The folder ``hydra.run.dir=...`` names, as Hydra's grammar reads it (quotes and escapes undone); `MateError`
    where it cannot parse it."""
    from mate_cli.config.check import parsed_value

    value = parsed_value(override)
    return value if isinstance(value, str) else override.partition("=")[2].strip("'\"")


def unwritable(folder: Path, err: OSError) -> str:
    return (
        f"cannot write run dirs in {folder} ({err.strerror or err}); set MATE_OUTPUT_DIR to a writable folder, "
        "or pass hydra.run.dir=<writable folder>"
    )


def check_output_root(args: list[str]) -> str | None:
    """The one-line problem when the folder of default run dirs cannot be made or written, before Hydra tries."""
    import tempfile  # here: the one-line errors before it do not pay its import

    if any(arg.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for arg in args):
        return None
    root = output_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            return None
    except OSError as err:
        return unwritable(root, err)


def run_hydra_app(app, program: str, command: str, args: list[str]) -> None:
    """Run ``app`` on ``sys.argv = [program, *args]``; the task gets ``[program, command, *args]``, the line Lightning's
    DDP launcher re-executes for ranks > 0 (:data:`mate_cli.run.job.COMMAND_LINE`)."""
    from mate_cli.run import job

    job.COMMAND_LINE[:] = [program, command, *args]
    sys.argv = [program, *args]
    app()


# ------------------------------------------------------------------ shell completion
BASH_COMPLETION = r"""# bash completion for `mate` (install: eval "$(mate -sc install=bash)")
_mate_completion()
{
    local line="${COMP_LINE:0:COMP_POINT}" word="" choices=""
    local -a words
    read -ra words <<< "$line"
    local count=${#words[@]}
    if [[ "$line" != *[[:space:]] ]]; then  # the cursor is on a word: complete it
        word="${words[count-1]}"
        count=$((count - 1))
    fi
    if (( count <= 1 )); then
        choices="__COMMANDS__"
    else
        choices=$(COMP_LINE="$line" COMP_POINT=${#line} "${words[0]}" "${words[1]}" -sc query=bash 2>/dev/null)
    fi
    COMPREPLY=($(compgen -o nospace -o default -W "$choices" -- "$word"))
}
COMP_WORDBREAKS=${COMP_WORDBREAKS//=}
complete -o nospace -o default -F _mate_completion mate
"""


def shell_completion(args: list[str], command: str | None, program: str) -> int:
    """``-sc install=bash`` / ``uninstall=bash``: the script; ``mate <command> -sc query=bash``: Hydra's completion."""
    settings = dict(arg.partition("=")[::2] for arg in args if "=" in arg)
    action = next((key for key in ("install", "uninstall", "query") if key in settings), None)
    shell = settings.get(action, "")
    if action is None or shell != "bash":
        return fail(
            "shell completion is for bash: use -sc install=bash, -sc uninstall=bash or -sc query=bash "
            "(with COMP_LINE set)"
        )
    if action == "install":
        print(BASH_COMPLETION.replace("__COMMANDS__", " ".join(COMMANDS)), end="")
        return 0
    if action == "uninstall":
        print("complete -r mate 2> /dev/null\nunset -f _mate_completion")
        return 0
    if command is None or "COMP_LINE" not in os.environ:
        return fail(
            "-sc query=bash needs a command and COMP_LINE, e.g. COMP_LINE='mate train data' mate train -sc query=bash"
        )
    # Hydra strips the program name from COMP_LINE; the command word goes too
    words = os.environ["COMP_LINE"].split(None, 2)
    if len(words) >= 2 and words[1] == command:
        os.environ["COMP_LINE"] = " ".join(["mate", *words[2:]]) + (" " if len(words) == 2 else "")
    app = answer_only_app(command)  # with -sc Hydra only answers the query
    sys.argv = [program, *args]
    app()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
