"""Lightning's W&B logger, quiet: with ``quiet`` W&B prints no start or closing lines (``mate train`` prints the run's
folder and sync command), and ``anonymous=None``, which W&B answers with a warning, is not passed. A service shared
through ``WANDB_SERVICE`` keeps holding a killed client's run id, so resuming that run fails with "run ID ... is in
use": one line with the fix."""

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
            in_use = type(err).__name__ == "ServerResponseError" and "is in use" in str(err)
            if in_use and os.environ.get("WANDB_SERVICE"):
                raise MateError(
                    f"W&B run {self._wandb_init.get('id')} is still held by the W&B service named in WANDB_SERVICE "
                    f"(the process that used it was killed): stop that service (`wandb beta core stop`) or unset "
                    f"WANDB_SERVICE, then resume again"
                ) from err
            raise
