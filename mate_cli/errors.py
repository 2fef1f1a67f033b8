"""The one exception type users can cause."""

from __future__ import annotations

from typing import Callable


class MateError(Exception):
    """A user-fixable error in one line: what went wrong, where (file / record / config key), and how to fix it.
    ``mate`` prints that line and exits with :attr:`exit_code` (:func:`mate_cli.run.job.run_task`)."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def check_choice(key: str, value, choices) -> None:
    if value not in choices:
        raise MateError(f"{key}={value!r} is invalid; use one of {', '.join(choices)}")


def find_in_chain(err: BaseException | None, kind: type, where: Callable[[BaseException], object] = bool):
    """The first ``kind`` in ``err``'s cause chain (``__cause__``, else ``__context__``) for which ``where`` holds."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, kind) and where(err):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None
