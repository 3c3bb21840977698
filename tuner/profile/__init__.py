"""Describe any transformers causal LM without training it: exact parameters and traced activations.

What this room does: count a model's parameters on the ``meta`` device (unique, tied weights once; bytes per dtype;
the largest single parameter), trace the bytes autograd saves for backward under fake tensors on a small copy of
the real model, and keep both as a small :class:`ModelProfile` (plain data) cached on disk.

What it may import: :mod:`tuner.workload` and the standard library everywhere; torch and transformers only in
:mod:`tuner.profile.hf`, :mod:`tuner.profile.trace` (with :mod:`tuner.profile.small_copy`, the copy it traces, and
:mod:`tuner.profile.autograd_saved`, what autograd saves), imported on a cache miss. :mod:`tuner.profile.describe`
builds a model's spec and profile from its config (the cache first). The estimator consumes profiles
(``Workload.profile``) and never imports this room's heavy modules.

Example:
    >>> from tuner.profile import ModelProfile, Linear
    >>> Linear(fixed=2048, per_sample=199168).at(4)
    798720
"""

from tuner.profile.cache import CACHE_ENV, ProfileCache, cache_dir
from tuner.profile.describe import (
    lengths_profile,
    load_model,
    model_from_config,
    model_profile,
    params_profile,
    with_profile,
)
from tuner.workload import ActivationProfile, Linear, ModelProfile

__all__ = [
    "CACHE_ENV",
    "ActivationProfile",
    "Linear",
    "ModelProfile",
    "ProfileCache",
    "cache_dir",
    "lengths_profile",
    "load_model",
    "model_from_config",
    "model_profile",
    "params_profile",
    "with_profile",
]
