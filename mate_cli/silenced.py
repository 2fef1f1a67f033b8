"""Third-party warnings mate understands, each filtered by message and module with its reason (listed in
docs/architecture.md too); everything else still shows. :func:`silence` runs in :func:`mate_cli.cli.main`, before a
command imports Lightning, and again in :func:`mate_cli.commands.common.quiet_third_party_logs`, for sweep workers."""

from __future__ import annotations

import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Silenced:
    message: str  # a regular expression matched at the start of the warning's text
    module: str  # ... and of the module that raised it
    why: str


SILENCED = (
    Silenced(
        message=r"You're resuming from a checkpoint that ended before the epoch ended",
        module="",  # raised through rank_zero_warn, which names the caller's module
        why="Lightning cannot see that mate restores the position in the epoch (and the RNG states) itself: "
        "resumed runs continue exactly, so mate says that in one line instead",
    ),
    Silenced(
        message=r"You have overridden `on_before_batch_transfer` in `LightningModule` but have passed in a",
        module="",  # raised through a warning cache, which names the caller's module
        why="mate's task modules check a batch's token-type ids there, before it moves to a GPU, and its "
        "datamodules do not override the hook: the module's implementation is the intended one",
    ),
    Silenced(
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        module=r"lightning\.pytorch\.utilities\._pytree",
        why="Lightning 2.6 calls a torch pytree API that torch 2.13 deprecates; it still works, nothing to change here",
    ),
)


def silence() -> None:
    """Install the filters of :data:`SILENCED` (idempotent: ``warnings`` drops duplicates)."""
    for entry in SILENCED:
        warnings.filterwarnings("ignore", message=entry.message, module=entry.module)
