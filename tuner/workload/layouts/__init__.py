"""The parallel layouts, one module each (the workload room's side of a layout: its degree, ds_config key, label,
flag, the config that sets it and its checks), and :data:`LAYOUTS`, the one registry the rooms above derive from: the
space's layout checks (:func:`tuner.space.choices.layout_choices`), the request's layout config
(:meth:`tuner.requests.TrialSettings.layout_config`), the CLI's layout flags and the recommender's grid.

:func:`check_layout` runs the kinds' checks of a trial (Ulysses' is :func:`check_long_context`).

Adding a layout: a module here (a :class:`~tuner.workload.layouts.base.LayoutKind`), a line in :data:`LAYOUTS`, its
degree on :class:`~tuner.workload.ParallelLayout`, its parameter in the default space, and its modules in the
estimator (``tuner/estimator/layouts/``) and the measure room (``tuner/measure/rank/layouts/``).
"""

from tuner.workload.config_values import ConfigError
from tuner.workload.layouts.autoep import AUTOEP, check_expert_parallel
from tuner.workload.layouts.autotp import AUTOTP, autotp_zero3_problem
from tuner.workload.layouts.base import LayoutKind
from tuner.workload.layouts.ulysses import ULYSSES, check_long_context
from tuner.workload.layouts.zeropp import HPZ
from tuner.workload.spec import Workload
from tuner.workload.trial import TrialConfig

LAYOUTS: tuple[LayoutKind, ...] = (ULYSSES, AUTOTP, AUTOEP, HPZ)  # in ParallelLayout.label's order
PLAINEST_FIRST: tuple[LayoutKind, ...] = (AUTOTP, HPZ, ULYSSES, AUTOEP)  # ParallelLayout.sort_key's order
BY_KEY = {kind.key: kind for kind in LAYOUTS}


def check_layout(workload: Workload, trial: TrialConfig, deepspeed_version: str | None = None) -> None:
    """Refuse an AutoTP, hpZ or AutoEP setting DeepSpeed cannot run on ``workload``, each kind's own check in this
    order (Ulysses and ALST are :func:`check_long_context`'s, which the estimator runs first); with
    ``deepspeed_version`` (where a run will train) also AutoTP with ZeRO-3 on a DeepSpeed older than 0.19.4.

    Raises:
        ConfigError: naming the field.
    """
    for kind in (AUTOTP, HPZ, AUTOEP):
        kind.check(workload, trial)
    if deepspeed_version is not None:
        problem = autotp_zero3_problem(trial, deepspeed_version)
        if problem:
            raise ConfigError(AUTOTP.key, problem)


__all__ = [
    "AUTOEP",
    "AUTOTP",
    "BY_KEY",
    "HPZ",
    "LAYOUTS",
    "PLAINEST_FIRST",
    "ULYSSES",
    "LayoutKind",
    "autotp_zero3_problem",
    "check_expert_parallel",
    "check_layout",
    "check_long_context",
]
