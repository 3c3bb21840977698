"""Resuming, and running one study from several processes: who holds which trial.

Each run of the loop is a holder (:func:`tuner.storage.new_holder`): a study user attribute in Optuna says it runs,
each trial it asks carries it as its owner, and the store leases the trials it runs to it (renewed every quarter of
:data:`TRIAL_LEASE_S`). When a run starts, what a killed process left running (its holder no longer alive, or, from
another host, its lease passed) is failed, in Optuna and in the store, so that it can be retried; what another live
process holds is left alone.
"""

from __future__ import annotations

import time

import optuna
from optuna.trial import TrialState

from tuner.storage import Store, new_holder, owner_alive, release
from tuner.study.optuna_storage import RetryingRDBStorage

TRIAL_LEASE_S = 120.0  # a running trial's lease, renewed every quarter of it while its process lives
OWNER_ATTR = "dstune_owner"  # Optuna user attribute: the process that asked the trial
OWNERLESS_GRACE_S = 30.0  # an Optuna trial asked this recently may not carry its owner yet
HOLDER_ATTR = "dstune_holder:"  # Optuna study user attributes: every run of the study going on, by holder


class Holding:
    """One run's hold on a study: its holder, the trials it leases, and what it fails of the runs before it."""

    def __init__(self, study: optuna.Study, storage: RetryingRDBStorage, store: Store, study_id: int) -> None:
        self.study, self.storage, self.store, self.study_id = study, storage, store, study_id
        self.owner = ""  # the holder of the trials a run starts: new in each run, released when it ends
        self._renewed_at = 0.0

    def begin(self) -> None:
        """A new run: a new holder, announced on the study (for other processes' :meth:`fail_stale`)."""
        self.owner = new_holder()
        self.study.set_user_attr(HOLDER_ATTR + self.owner, True)

    def fail_stale(self) -> list[int]:
        """Fail what a killed process left running, in Optuna and in the store; returns the store's ids of those
        trials (to be retried). What another live process holds is left alone."""
        stale_ids = self.store.mark_stale_running_failed(self.study_id)
        held = {t.number for t in self.store.trials(self.study_id, status="running")}
        holders = [key.removeprefix(HOLDER_ATTR) for key in self.study.user_attrs if key.startswith(HOLDER_ATTR)]
        for holder in holders:
            if owner_alive(holder) is False:  # a run that was killed before it could remove its own
                self.storage.delete_study_user_attr(self.study._study_id, HOLDER_ATTR + holder)
        others = any(holder != self.owner and owner_alive(holder) is not False for holder in holders)
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if _optuna_trial_stale(trial, held, others):
                self.study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        return stale_ids

    def renew(self, trial_ids: list[int]) -> None:
        """Keep holding the trials in flight (every quarter lease), so a resuming process elsewhere leaves them be."""
        if time.monotonic() - self._renewed_at >= TRIAL_LEASE_S / 4:
            self._renewed_at = time.monotonic()
            self.store.renew_trial_leases(trial_ids, self.owner, TRIAL_LEASE_S)

    def release(self) -> None:
        """The run's trials are stale from now on, to this process too."""
        release(self.owner)

    def drop(self) -> None:
        """This run is over: its holder attribute goes, so a finished study keeps none."""
        self.storage.delete_study_user_attr(self.study._study_id, HOLDER_ATTR + self.owner)


def _optuna_trial_stale(trial: optuna.trial.FrozenTrial, held: set[int], others: bool) -> bool:
    """True when nobody runs this RUNNING Optuna trial any more: it was asked by a process that is gone (this host),
    or, by one elsewhere, its trial is not held in the store and it is older than a lease. A trial without an owner
    (asked before owners were recorded, or killed right after ``ask``, before its owner was written) is stale at once
    when no ``others`` (another run of the study that may be alive) could have just asked it, else once it is older
    than :data:`OWNERLESS_GRACE_S`."""
    owner = trial.user_attrs.get(OWNER_ATTR)
    started = trial.datetime_start.timestamp() if trial.datetime_start else 0.0
    if owner is None:
        return not others or time.time() - started > OWNERLESS_GRACE_S
    alive = owner_alive(owner)
    if alive is not None:
        return not alive
    return trial.number not in held and time.time() - started > TRIAL_LEASE_S
