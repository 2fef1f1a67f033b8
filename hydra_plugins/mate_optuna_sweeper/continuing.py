"""Hydra's Optuna sweeper, continued when run again (``hparams_search=optuna``). Hydra takes sweepers from the
``hydra_plugins`` package only, hence this module's place; it imports Optuna only when a sweep runs (Hydra imports
every plugin module at each start).

Run again with the same ``hydra.sweeper.storage=`` (a database Optuna keeps the study in) and
``hydra.sweep.dir=``, a search finishes only what is left: ``n_trials`` is the study's total, not each call's. Each
job is numbered as its trial, so its folder is ``<trial number>-<its values>`` in every call; a trial an earlier call
started and never finished (cut by a signal or a time limit: Optuna still holds it as running) is run again with its
own values in its own folder, where it resumes from its ``last.ckpt`` (:mod:`mate_cli.run.sweep`), and its result is
told to that trial. Then the sweeper asks Optuna for the trials still missing. Without a storage the study lives in
memory and every call is a new search.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)


class ContinuingOptunaSweeper(OptunaSweeper):
    """:class:`OptunaSweeper` that continues its study: see the module's docstring."""

    def sweep(self, arguments: list[str]) -> Any:
        import optuna

        impl = self.sweeper
        study = self._earlier_study()
        if study is not None:
            finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
            cut = [t for t in study.trials if self._cut(t)]
            for trial in cut:  # each in its own folder, numbered as the trial: it resumes there
                self._run_again(study, trial)
            left = max(0, impl.n_trials - len(finished) - len(cut))
            log.info("study %s: %d trial(s) finished earlier, %d resumed, %d to ask", study.study_name, len(finished),
                     len(cut), left)  # fmt: skip
            impl.n_trials = left
            impl.job_idx = len(study.trials)  # the next trial's number
        return super().sweep(arguments)

    def _earlier_study(self) -> optuna.Study | None:
        """The study in the storage, if there is one already; None without a storage or before the first call."""
        import optuna

        impl = self.sweeper
        if impl.storage is None or impl.study_name is None:
            return None
        try:
            return optuna.load_study(study_name=impl.study_name, storage=impl.storage)
        except KeyError:  # no such study yet
            return None

    def _cut(self, trial: optuna.trial.FrozenTrial) -> bool:
        """Whether ``trial`` was cut: still running in the study (the call ended before its result), or failed with a
        folder that a resume continues (a job in another process returns no number when a signal or its budget stops
        it)."""
        import optuna

        if trial.state == optuna.trial.TrialState.RUNNING:
            return True
        if trial.state != optuna.trial.TrialState.FAIL:
            return False
        from mate_cli.run.sweep import CUT, earlier_state

        folders = [p for p in Path(self.sweeper.sweep_dir).glob(f"{trial.number}-*") if (p / ".hydra").is_dir()]
        return any(earlier_state(folder) == CUT for folder in folders)

    def _run_again(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """``trial`` run again with its values as job number ``trial.number``, its result told to the study: to the
        trial itself while it runs there, else as a trial of those values added."""
        import optuna

        impl = self.sweeper
        values = {
            **trial.params,
            **trial.user_attrs,
        }  # the sampled values, then the fixed ones, as the sweeper sets them
        overrides = [tuple(f"{name}={value}" for name, value in values.items())]
        (ret,) = impl.launcher.launch(overrides, initial_job_idx=trial.number)
        try:
            value = float(ret.return_value)
        except (TypeError, ValueError):  # no number: stopped or failed again; the next call tries once more
            value = None
        if trial.state == optuna.trial.TrialState.RUNNING:
            done = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
            study.tell(trial.number, value, state=done)
        elif value is not None:
            study.add_trial(optuna.trial.create_trial(params=trial.params, distributions=trial.distributions,
                                                      user_attrs=trial.user_attrs, value=value))  # fmt: skip
