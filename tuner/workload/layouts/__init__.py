"""The parallel layouts, one module each (the workload room's side of a layout: its degree, ds_config key, label,
flag, the config that sets it and its checks), and :data:`LAYOUTS`, the one registry the rooms above derive from: the
space's layout checks (:func:`tuner.space.choices.layout_choices`), the request's layout config
(:meth:`tuner.requests.TrialSettings.layout_config`), the CLI's layout flags and the recommender's grid.

Adding a layout: a module here (a :class:`~tuner.workload.layouts.base.LayoutKind`), a line in :data:`LAYOUTS`, its
degree on :class:`~tuner.workload.ParallelLayout`, its parameter in the default space, and its modules in the
estimator (``tuner/estimator/layouts/``) and the measure room (``tuner/measure/rank/layouts/``).
"""

from tuner.workload.layouts.autoep import AUTOEP
from tuner.workload.layouts.autotp import AUTOTP
from tuner.workload.layouts.base import LayoutKind
from tuner.workload.layouts.ulysses import ULYSSES
from tuner.workload.layouts.zeropp import HPZ

LAYOUTS: tuple[LayoutKind, ...] = (ULYSSES, AUTOTP, AUTOEP, HPZ)  # in ParallelLayout.label's order
PLAINEST_FIRST: tuple[LayoutKind, ...] = (AUTOTP, HPZ, ULYSSES, AUTOEP)  # ParallelLayout.sort_key's order
BY_KEY = {kind.key: kind for kind in LAYOUTS}

__all__ = ["AUTOEP", "AUTOTP", "BY_KEY", "HPZ", "LAYOUTS", "PLAINEST_FIRST", "ULYSSES", "LayoutKind"]
