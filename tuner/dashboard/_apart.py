"""What tells the dashboard's rows apart where their usual words read alike: workloads (and length searches) whose
descriptions are the same say the settings in which they differ (the precision, the optimizer, the cluster's shape,
the adapter...), and a study's trials whose one-line configs are the same say the ds_config keys in which they
differ (bucket sizes, ``overlap_comm``, run settings), as ``dstune tune``'s top-configs table does
(:mod:`tuner.workload.differences`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from tuner.storage import TrialRecord, WorkloadRecord
from tuner.workload.differences import (
    WORKLOAD_PREFIXES,
    describe_differences,
    differing_keys,
    summary_keys,
    trial_settings,
    workload_settings,
)

# what a workload's description already says (:func:`tuner.dashboard._views.describe_workload`; its launch
# environment is left out of the settings compared)
DESCRIBED = ("model.name", "model.architecture", "cluster.gpu_memory", "cluster.device", "train.seq_len")


def tell_apart(rows: Sequence[tuple[str, WorkloadRecord]]) -> list[str]:
    """For each row (its description and workload) whose description another row shares, the settings in which their
    workloads differ (empty where the description tells it apart already), in the rows' order."""
    alike: dict[str, list[int]] = defaultdict(list)
    for index, (description, _) in enumerate(rows):
        alike[description].append(index)
    found = [""] * len(rows)
    for group in alike.values():
        if len(group) < 2:
            continue
        settings = [workload_settings(rows[index][1].workload) for index in group]
        keys = differing_keys(settings, DESCRIBED)
        for index, values in zip(group, settings, strict=True):
            found[index] = describe_differences(values, keys, WORKLOAD_PREFIXES)
    return found


def trial_differences(trials: Sequence[TrialRecord]) -> dict[int, str]:
    """For each trial (by id) whose one-line config another trial shares: its values of the ds_config keys in which
    those trials differ (empty where the one line tells it apart already)."""
    alike: dict[str, list[TrialRecord]] = defaultdict(list)
    for trial in trials:
        if trial.ds_config:
            alike[trial.trial.summary()].append(trial)
    shown = summary_keys()
    found: dict[int, str] = {}
    for group in alike.values():
        if len(group) < 2:
            continue
        settings = [trial_settings(trial.trial) for trial in group]
        keys = differing_keys(settings, shown)
        found.update(
            {trial.id: describe_differences(values, keys) for trial, values in zip(group, settings, strict=True)}
        )
    return found


__all__ = ["DESCRIBED", "tell_apart", "trial_differences"]
