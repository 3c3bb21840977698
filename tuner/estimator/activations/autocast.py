"""Which traced activations a trial reads under a ds_config's ``torch_autocast`` (:mod:`tuner.workload.autocast`):
those traced under the same autocast where the workload's profile has them, else the training precision's."""

from __future__ import annotations

from tuner.estimator.settings import Settings
from tuner.workload import Workload
from tuner.workload.autocast import trace_precision


def activation_precision(workload: Workload, s: Settings) -> str:
    """The trace precision of the activations :func:`tuner.estimator.activations.saved.workload_activation_bytes` reads
    for this trial: with ``torch_autocast`` the one traced under it on the workload's device when the profile holds
    it (the CLI and API trace it for such a config), else the training precision's, as without autocast."""
    key = trace_precision(s.precision, s.autocast, workload.cluster.device)
    profile = workload.profile
    if key != s.precision and profile is not None and any(entry.precision == key for entry in profile.activations):
        return key
    return s.precision
