"""The proposer: where the loop's next config comes from.

In order: a config queued in Optuna (a new study's warm start, the throughput model's best-predicted configs first;
a retry of a run lost with its node), then, in a guided study (TPE, GP), the throughput model's pick between the
sampler's proposals, then the sampler itself. Every trial asked carries its owner (this run's holder), so a resuming
process can tell whether anyone still runs it (:mod:`tuner.study.resume`).
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from tuner.forecast import ThroughputGuide
from tuner.storage import TrialRecord
from tuner.study.resume import OWNER_ATTR

RETRIES = 1  # a trial left running by a killed process (or lost with its node) is run once more


class Proposer:
    """Asks Optuna for the next trial, after queueing what must go first (warm start, retries, the guide's picks)."""

    def __init__(self, study: optuna.Study, guide: ThroughputGuide, guided: bool) -> None:
        self.study, self.guide, self.guided = study, guide, guided
        self.requeued: set[str] = set()  # config keys of runs lost with their infrastructure, queued again

    def warm_start(self) -> None:
        """A new guided study measures the throughput model's best-predicted configs first."""
        if self.guided and not self.study.get_trials(deepcopy=False):
            for params in self.guide.warm_start():
                self.study.enqueue_trial(params)

    def ask(self, owner: str) -> optuna.Trial:
        """The next trial, its owner recorded: a queued one, else the guide's pick, else the sampler's proposal."""
        if self.guided and not self._waiting():
            pick = self.guide.next_pick()
            if pick is not None:
                self.study.enqueue_trial(pick)
        trial = self.study.ask()
        trial.set_user_attr(OWNER_ATTR, owner)
        return trial

    def proposed(self, key: str) -> None:
        """The config ``key`` was proposed: a run lost with its node and queued again no longer waits."""
        self.requeued.discard(key)

    def queue_retry(self, record: TrialRecord) -> bool:
        """Queue a failed trial's config to be proposed again, while it has retries left (:data:`RETRIES`)."""
        if record.params is None or record.attempts > RETRIES:
            return False
        self.study.enqueue_trial(record.params, skip_if_exists=False)
        return True

    def requeue_lost(self, record: TrialRecord) -> bool:
        """Queue again the config of a run lost with its node, actor or fork server; False: out of retries."""
        requeued = self.queue_retry(record)
        if requeued:
            self.requeued.add(record.config_key)
        return requeued

    def retry_waiting(self) -> bool:
        """A run lost with its node, actor or fork server is queued again and still waits (it is measured even at
        the budget)."""
        if self.requeued and not self._waiting():
            self.requeued.clear()  # nothing is queued any more: whatever took its place ran
        return bool(self.requeued)

    def _waiting(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
