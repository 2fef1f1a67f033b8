"""Lightning's W&B logger, quiet: with ``quiet`` W&B prints no start or closing lines (``mate train`` prints the run's
folder and sync command), and ``anonymous=None``, which W&B answers with a warning, is not passed. A service shared
through ``WANDB_SERVICE`` keeps holding a killed client's run id, so resuming that run fails with "run ID ... is in
use": one line with the fix.

Online (``logger.wandb.offline=false``), a run W&B cannot start is one line saying what to do (`wandb login`, or log
offline), never a traceback: W&B's server is tried first (:func:`unreachable`, seconds where W&B itself waits out its
``init_timeout``, 90 s by default), then what W&B raises (no API key, a refused key, its own timeout) is that line."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from mate_cli.errors import MateError

#: seconds :func:`unreachable` waits for W&B's server to accept a connection
CONNECT_S = 10.0
#: the environment variables of an HTTP proxy (W&B's own too), through which W&B reaches its server (none tried
#: directly then)
PROXIES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "WANDB_HTTPS_PROXY",
    "WANDB_HTTP_PROXY",
)


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
        online = self._experiment is None and rank_zero_only.rank == 0 and self._online_base_url()
        if online and (why := unreachable(online)):
            raise MateError(self._cannot_start(f"W&B's server {online} cannot be reached from here: {why}"))
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
            import wandb

            if online and isinstance(err, (wandb.errors.Error, TimeoutError)):
                said = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
                raise MateError(self._cannot_start(f"W&B: {said}")) from err
            raise

    def _online_base_url(self) -> str | None:
        """W&B's server, where this run is to log online (W&B's settings: its environment variables and settings
        file); None offline."""
        if self._offline:
            return None
        import wandb

        settings = wandb.setup().settings
        mode = self._wandb_init.get("mode") or settings.mode
        return None if mode in ("offline", "dryrun", "disabled") else str(settings.base_url)

    def _cannot_start(self, why: str) -> str:
        key = os.environ.get("WANDB_API_KEY")
        why = why.replace(key, "<API key>") if key else why
        return (
            f"logger.wandb.offline=false: W&B cannot start run {self._wandb_init.get('id')} online ({why}); run "
            f"`wandb login` (or set WANDB_API_KEY) where W&B's server can be reached, or log offline: "
            "logger.wandb.offline=true (or WANDB_MODE=offline), then upload with "
            "`wandb sync <run dir>/wandb/offline-run-*`"
        )


def unreachable(url: str, timeout: float = CONNECT_S) -> str | None:
    """Why a connection to ``url``'s host cannot be opened from here (its name unknown, refused, no answer within
    ``timeout``), or None when it can, or when an HTTP proxy (:data:`PROXIES`) would carry W&B's instead."""
    if any(os.environ.get(name) for name in PROXIES):
        return None
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror as err:
        return f"{host} has no address ({err.strerror})"
    except TimeoutError:
        return f"no answer from {host}:{port} within {timeout:g} s"
    except OSError as err:
        return f"{host}:{port}: {err.strerror or err}"
