"""Lightning's W&B logger as mate runs it: quiet, and continued across a resume.

- ``quiet`` (default): W&B's own start and closing lines (run summary, history, "find
  logs at", "you can sync") are not printed; mate ends each run by printing the W&B
  run's folder and the ``wandb sync`` command for it (:mod:`mate_cli.console`).
- Lightning passes ``anonymous=None`` to ``wandb.init``, which W&B answers with a
  deprecation warning on every run; the key is dropped when it says nothing.
- ``id``: set by ``mate train`` before the logger is built (a resumed run takes its
  checkpoint's run's id: :func:`mate_cli.resume.continue_wandb_run`); Lightning already
  passes ``resume="allow"``, so the resumed run continues that W&B run.
"""

from __future__ import annotations

from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger


class WandbLogger(LightningWandbLogger):
    def __init__(self, *args, quiet: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)
        if quiet and "settings" not in self._wandb_init:
            import wandb

            self._wandb_init["settings"] = wandb.Settings(silent=True)  # quiet=True still prints 3 lines
