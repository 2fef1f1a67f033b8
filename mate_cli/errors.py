"""The one exception type users can cause."""

from __future__ import annotations


class MateError(Exception):
    """A user-fixable error in one line: what went wrong, where (file / record / config key), and how to fix it.
    ``mate`` prints that line and exits with :attr:`exit_code` (:func:`mate_cli.commands.common.run_task`)."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
