"""Model profiles cached on disk as small JSON files (pure Python: no torch).

The cache lives under ``$DSTUNE_PROFILE_CACHE`` (default ``~/.cache/dstune/profiles``). Parameter facts are keyed by
the config and the transformers version (and, for the model as trained, the workload's trainable part: adapter
and freeze pattern); each activation profile also by sequence length, precision, attention
implementation, MoE experts implementation and checkpointing. Files are written atomically (a temporary file renamed
into place), so concurrent writers and readers never see half a profile; a file that cannot be read is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from tuner import env
from tuner.workload import PROFILE_FORMAT, ActivationProfile, ModelProfile, TrainableSpec

CACHE_ENV = "DSTUNE_PROFILE_CACHE"


def cache_dir() -> Path:
    """The cache folder: ``$DSTUNE_PROFILE_CACHE`` or ``~/.cache/dstune/profiles``."""
    return env.current().profile_cache.expanduser()


METADATA_KEYS = ("_name_or_path", "transformers_version")  # where a config came from, not what it builds


def canonical_config(config: Any) -> str:
    """The config (or any JSON-ready value) as canonical JSON (sorted keys, no spaces, without the metadata keys
    that say where a config came from): configs that build the same model give equal keys."""
    if isinstance(config, dict):
        config = {key: value for key, value in config.items() if key not in METADATA_KEYS}
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)


def trainable_key(trainable: TrainableSpec | None) -> list[str]:
    """The key parts of the model as trained: none for full fine-tuning (its keys are what they always were)."""
    if trainable is None or trainable.is_full:
        return []
    quantization = [trainable.quantization] if trainable.quantization else []  # keys made before it stay
    return ["trainable", trainable.peft, trainable.freeze, *quantization]


def params_key(config: dict[str, Any], transformers_version: str, trainable: TrainableSpec | None = None) -> str:
    """Cache key of a model's parameter facts (of the model as trained, for an adapter or a freeze pattern)."""
    return _digest(
        ["params", PROFILE_FORMAT, canonical_config(config), transformers_version, *trainable_key(trainable)]
    )


def activation_key(
    config: dict[str, Any],
    transformers_version: str,
    seq_len: int,
    precision: str,
    attention: str,
    experts: str,
    checkpointing: bool,
    trainable: TrainableSpec | None = None,
    adapters: str = "",
) -> str:
    """Cache key of one activation profile (of the model as trained: its trainable part and adapters' dtype)."""
    extra = [*trainable_key(trainable), adapters] if trainable_key(trainable) else []
    return _digest(
        [
            "activations",
            PROFILE_FORMAT,
            canonical_config(config),
            transformers_version,
            seq_len,
            precision,
            attention,
            experts,
            checkpointing,
            *extra,
        ]
    )


def _digest(parts: list[Any]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


class ProfileCache:
    """Reads and writes profile parts in one folder (created on first write)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder or cache_dir()

    def _path(self, kind: str, key: str) -> Path:
        return self.folder / f"{kind}-{key}.json"

    def _read(self, kind: str, key: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._path(kind, key).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write(self, kind: str, key: str, data: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.folder, prefix=f".{kind}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(data, handle, separators=(",", ":"))
            os.replace(temporary, self._path(kind, key))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def get_params(self, key: str) -> ModelProfile | None:
        """The parameter facts (a profile without activations), or None on a miss."""
        data = self._read("params", key)
        try:
            return ModelProfile.from_dict(data) if data else None
        except (KeyError, TypeError, ValueError):
            return None

    def put_params(self, key: str, profile: ModelProfile) -> None:
        """Store a profile's parameter facts (its activations are stored separately)."""
        self._write("params", key, profile.without_activations().to_dict())

    def get_activation(self, key: str) -> ActivationProfile | None:
        """One activation profile, or None on a miss."""
        data = self._read("activations", key)
        try:
            return ActivationProfile.from_dict(data) if data and data.get("format") == PROFILE_FORMAT else None
        except (KeyError, TypeError, ValueError):
            return None

    def put_activation(self, key: str, entry: ActivationProfile) -> None:
        """Store one activation profile."""
        self._write("activations", key, {**entry.to_dict(), "format": PROFILE_FORMAT})
