"""What a search over the sequence length (``dstune estimate --max-seq-len``, ``seq_len: "max"`` on the API) merges
over every candidate's config, from a trial's shortcut fields: one function for both faces, so that a field the
search has no dimension for (the numerics choices, AutoTP, AutoEP, hpZ) pins the answer alike on each."""

from __future__ import annotations

from typing import Any

from tuner.requests.trial import TrialSettings
from tuner.workload.layouts import LAYOUTS

# the layouts the search does not vary (it searches the memory savers: Ulysses), pinned as their ds_config sections
PINNED_LAYOUTS = tuple(kind.field for kind in LAYOUTS if not kind.memory_saver)


def pinned_sections(settings: TrialSettings) -> dict[str, Any] | None:
    """The sections every candidate gets: the layouts the search does not vary, then the numerics fields' keys
    (``bf16_master_weights``, ``optimizer``, ``chunked_loss``, ``liger``...), then ``ds_config`` (it wins), as
    :meth:`~tuner.requests.TrialRequest.to_trial` merges them (:meth:`~tuner.requests.TrialSettings.with_choices`);
    None when there are none.

    >>> pinned_sections(TrialSettings(liger=True, tensor_parallel=2))
    {'tensor_parallel': {'autotp_size': 2}, 'dstune': {'liger_kernel': True}}
    """
    layouts = TrialSettings(**{name: getattr(settings, name) for name in PINNED_LAYOUTS})
    return settings.with_choices(layouts.layout_config()) or None


__all__ = ["PINNED_LAYOUTS", "pinned_sections"]
