"""What the user gave to run their own script: the command, where its ds_config goes, where its batch flags are.

Pure data: it travels in :class:`~tuner.measure.options.MeasureOptions` and in queued jobs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import InputError

# DeepSpeed autotuner's arg_mappings keys (the same names, so a DSA user's mapping carries over)
MAPPABLE = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclass(frozen=True)
class ScriptCommand:
    """The user's training command, run unchanged but for the ds_config and batch flags.

    Attributes:
        argv: The command as the user runs it (``deepspeed train.py --deepspeed ds.json``).
        cwd: The folder it runs in (where relative paths in it resolve).
        config_at: Where the ds_config goes when dstune cannot find it: a flag (``--ds``), a dotted key of the first
            YAML/JSON config file the command names (``train.deepspeed``), or ``FILE:KEY``. None: found by itself.
        arg_mappings: ``(ds_config key, flag)`` pairs in DeepSpeed autotuner's ``arg_mappings`` form: the script's
            own flags for the micro-batch and the accumulation steps.

    >>> ScriptCommand.of(["python", "t.py"], "/w", None, ["train_micro_batch_size_per_gpu=--bs"]).arg_mappings
    (('train_micro_batch_size_per_gpu', '--bs'),)
    """

    argv: tuple[str, ...]
    cwd: str
    config_at: str | None = None
    arg_mappings: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @classmethod
    def of(
        cls, argv: list[str], cwd: str, config_at: str | None = None, mappings: list[str] | None = None
    ) -> ScriptCommand:
        """From the CLI's pieces; a bad mapping is :class:`InputError` naming ``arg-mapping``."""
        if not argv:
            raise InputError("command", "give the training command after --")
        return cls(tuple(argv), cwd, config_at or None, parse_mappings(mappings or []))

    def digest(self) -> str:
        """What tells one command's model from another's (a command tuned without a model): its folder and words,
        hashed.

        >>> ScriptCommand(("deepspeed", "train.py"), "/jobs/a").digest()
        '8fcf770f'
        """
        return hashlib.sha1("\0".join((self.cwd, *self.argv)).encode()).hexdigest()[:8]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (a queued job's record)."""
        return {
            "argv": list(self.argv),
            "cwd": self.cwd,
            "config_at": self.config_at,
            "arg_mappings": [list(pair) for pair in self.arg_mappings],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScriptCommand:
        """The inverse of :meth:`to_dict`."""
        pairs = data.get("arg_mappings") or []
        at = data.get("config_at")
        return cls(tuple(data["argv"]), str(data["cwd"]), at, tuple((str(k), str(v)) for k, v in pairs))

    def display(self) -> str:
        """The command as one shell line."""
        import shlex

        return shlex.join(self.argv)


def parse_mappings(items: list[str]) -> tuple[tuple[str, str], ...]:
    """``KEY=FLAG`` items (``train_micro_batch_size_per_gpu=--batch_size``) as pairs.

    >>> parse_mappings(["gradient_accumulation_steps=--ga"])
    (('gradient_accumulation_steps', '--ga'),)
    """
    pairs = []
    for item in items:
        key, sep, flag = item.partition("=")
        if not sep or key not in MAPPABLE or not flag.startswith("-"):
            raise InputError("arg-mapping", f"expected KEY=--flag with KEY one of {', '.join(MAPPABLE)}, got {item!r}")
        pairs.append((key, flag))
    return tuple(pairs)
