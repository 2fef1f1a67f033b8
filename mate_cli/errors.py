"""The one exception type users can cause, and how the CLI reports it.

`MateError` carries one line: what went wrong, where (file / record / config key),
and how to fix it. `mate` prints that line and exits with status 2.
"""

from __future__ import annotations


class MateError(Exception):
    """A user-fixable error. The message is one line: what, where, how to fix."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
