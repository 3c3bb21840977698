"""The proposer: where the loop's next config comes from.

In order: a retry (a config a killed process left running, or a run lost with its node: queued with
:data:`RETRY_ATTR`), then a config queued in Optuna (a new study's warm start, the throughput model's best-predicted
configs first), then, in a guided study (TPE, GP), the throughput model's pick between the sampler's proposals, then
the sampler itself. A retry goes first whatever was queued before it, so that a warm start (or anything else) cannot
fill the budget ahead of it; its config is recorded already, so it takes no second share of the budget. Every trial
asked carries its owner (this run's holder), so a resuming process can tell whether anyone still runs it
(:mod:`tuner.study.resume`).
"""

from __future__ import annotations

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from tuner.forecast import ThroughputGuide
from tuner.storage import TrialRecord
from tuner.study.resume import OWNER_ATTR

RETRIES = 1  # a trial left running by a killed process (or lost with its node) is run once more
RETRY_ATTR = "dstune_retry"  # Optuna user attribute of a queued retry: the store's id of the trial it runs again


class Proposer:
    """Asks Optuna for the next trial: a queued retry first, else after queueing the guide's pick when nothing waits."""

    def __init__(
        self, study: optuna.Study, guide: ThroughputGuide, guided: bool, first: list[dict] | None = None
    ) -> None:
        self.study, self.guide, self.guided = study, guide, guided
        self.first = first  # what a new guided study measures first instead of the guide's picks (a command's model)

    def warm_start(self) -> None:
        """A new guided study measures the throughput model's best-predicted configs first (or :attr:`first`)."""
        if self.guided and not self.study.get_trials(deepcopy=False):
            for params in self.first if self.first is not None else self.guide.warm_start():
                self.study.enqueue_trial(params)

    def ask(self, owner: str) -> optuna.Trial:
        """The next trial, its owner recorded: a retry, else a queued one, else the guide's pick, else the sampler's
        proposal."""
        trial = self._pop_retry()
        if trial is None:
            if self.guided and not self._waiting():
                pick = self.guide.next_pick()
                if pick is not None:
                    self.study.enqueue_trial(pick)
            trial = self.study.ask()
        trial.set_user_attr(OWNER_ATTR, owner)
        return trial

    def queue_retry(self, record: TrialRecord) -> bool:
        """Queue a failed trial's config to be proposed again, while it has retries left (:data:`RETRIES`)."""
        if record.params is None or record.attempts > RETRIES:
            return False
        self.study.enqueue_trial(record.params, user_attrs={RETRY_ATTR: record.id}, skip_if_exists=False)
        return True

    def retry_waiting(self) -> bool:
        """A retry is queued and still waits: it is run even at the budget (its config counts there already)."""
        return any(RETRY_ATTR in trial.user_attrs for trial in self._waiting())

    def _pop_retry(self) -> optuna.Trial | None:
        """Take the first queued retry, as :meth:`optuna.Study.ask` takes the first queued trial (a trial another
        process took meanwhile is skipped); None when no retry waits."""
        self.study._thread_local.cached_all_trials = None  # as ask does: the sampler sees every trial so far
        for waiting in self._waiting():
            if RETRY_ATTR not in waiting.user_attrs:
                continue
            try:
                if not self.study._storage.set_trial_state_values(waiting._trial_id, state=TrialState.RUNNING):
                    continue
            except UpdateFinishedTrialError:
                continue
            return optuna.Trial(self.study, waiting._trial_id)
        return None

    def _waiting(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
