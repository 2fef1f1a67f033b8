"""Lightning's W&B logger as mate runs it: quiet, and continued across a resume.

- ``quiet`` (default): W&B's own start and closing lines (run summary, history, "find
  logs at", "you can sync") are not printed; ``mate train`` ends by printing the W&B
  run's folder, and for an offline run the ``wandb sync`` command
  (:func:`mate_cli.commands.train.outputs`).
- Lightning passes ``anonymous=None`` to ``wandb.init``, which W&B answers with "The
  anonymous setting has no effect" on every run; the key is dropped when it is None.
- ``id``: :func:`mate_cli.resume.continue_wandb_run`.
- A W&B service shared through ``WANDB_SERVICE`` (``wandb beta core start``) keeps holding
  the run id of a client that was killed (``kill -9``, an out-of-memory kill), so resuming
  that run through the same service is refused with "run ID ... is in use": mate says so
  in one line with the fix (exit 2). Without ``WANDB_SERVICE`` each mate process starts
  its own service, which ends with it.
"""

from __future__ import annotations

import os

from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger

from mate_cli.errors import MateError


class WandbLogger(LightningWandbLogger):
    def __init__(self, *args, quiet: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)
        if quiet and "settings" not in self._wandb_init:
            import wandb

            self._wandb_init["settings"] = wandb.Settings(silent=True)  # quiet=True still prints 3 lines

    @property
    def experiment(self):
        try:
            return super().experiment
        except Exception as err:
            if (
                type(err).__name__ == "ServerResponseError"
                and "is in use" in str(err)
                and os.environ.get("WANDB_SERVICE")
            ):
                raise MateError(
                    f"W&B run {self._wandb_init.get('id')} is still held by the W&B service named in WANDB_SERVICE "
                    f"(the process that used it was killed): stop that service (`wandb beta core stop`) or unset "
                    f"WANDB_SERVICE, then resume again"
                ) from err
            raise
