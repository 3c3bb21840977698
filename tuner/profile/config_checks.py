"""Checks on a model config before anything describes it, with no torch or transformers import: the installed
transformers version (part of every profile's cache key) and the refusal of custom model code. A leaf of the profile
room: the cache lookup, the builder and the profiling service all use it."""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from tuner.workload import WorkloadError


@lru_cache(maxsize=1)
def transformers_version() -> str:
    """The installed transformers version, read without importing it."""
    try:
        return version("transformers")
    except PackageNotFoundError:
        raise WorkloadError("model", "transformers is not installed: pip install transformers") from None


def refuse_custom_code(config: Any) -> dict[str, Any]:
    """The config, unless it is not an object or asks for custom model code (checked before any cache lookup)."""
    if not isinstance(config, dict):
        raise WorkloadError("model", "config.json must hold a JSON object")
    for key in ("auto_map", "trust_remote_code"):
        if config.get(key):
            raise WorkloadError(
                f"model.{key}", "custom model code (trust_remote_code) is refused; use a model_type transformers ships"
            )
    if not isinstance(config.get("model_type"), str):
        raise WorkloadError("model.model_type", "missing from the model config")
    return config


__all__ = ["refuse_custom_code", "transformers_version"]
