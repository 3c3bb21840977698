"""Search spaces: declarative YAML spaces (built-ins shipped in ``builtin/``) turned into DeepSpeed configs.

May import: :mod:`tuner.workload`, :mod:`tuner.estimator` (its config resolution), PyYAML. Never Optuna's storage,
SQL, Ray or torch: a space only asks an Optuna-like trial for values.
"""

from tuner.space.core import (
    InfeasibleConfig,
    SearchSpace,
    SpaceError,
    Suggestion,
    config_key,
    default_space_path,
    load_space,
    parse_space,
    resolve_space,
    space_dir,
    space_names,
)

__all__ = [
    "InfeasibleConfig",
    "SearchSpace",
    "SpaceError",
    "Suggestion",
    "config_key",
    "default_space_path",
    "load_space",
    "parse_space",
    "resolve_space",
    "space_dir",
    "space_names",
]
