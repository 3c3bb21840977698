"""The trial's config handed to ``deepspeed.initialize`` inside the script's own call, for a command that names no
ds_config: the script builds one and passes it (``config=ds_config``, as DeepSpeedExamples' and DeepSpeed-Chat's
scripts do, or ``args.deepspeed_config``). Its config is the base and the trial's decisions are merged over it as over
a ds_config file (:func:`~tuner.measure.script.placement.trial_config`: its optimizer, scheduler and precision stay)."""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.measure.script.placement import _read_config, inline_config, trial_config


def script_config(given: Any) -> dict[str, Any]:
    """The config a script handed to ``deepspeed.initialize`` as a dict: a dict, a file path or an inline string.

    >>> script_config({"train_batch_size": 8}), script_config(None)
    ({'train_batch_size': 8}, {})
    """
    if given is None:
        return {}
    if isinstance(given, dict):
        return copy.deepcopy(given)
    text = str(given)
    if Path(text).is_file():
        data = _read_config(Path(text))
        return data if isinstance(data, dict) else {}
    return inline_config(text) or {}


def merged_call(
    initialize: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], decisions: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    """``deepspeed.initialize``'s arguments with the script's config (``config``, ``config_params`` or its
    ``args.deepspeed_config``) replaced by it with the trial's ``decisions`` over it, and that config.

    >>> def initialize(args=None, model=None, config=None, config_params=None): ...
    >>> _, kwargs, config = merged_call(initialize, (), {"model": 1, "config": {"train_batch_size": 16,
    ...     "optimizer": {"type": "Adam"}}}, {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4})
    >>> kwargs["config"] == config, config["optimizer"], config["train_batch_size"]
    (True, {'type': 'Adam'}, 8)
    """
    bound = inspect.signature(initialize).bind_partial(*args, **kwargs)
    given = bound.arguments
    own = given.pop("config", None)
    legacy = given.pop("config_params", None)
    namespace: Any = given.get("args")
    from_args = getattr(namespace, "deepspeed_config", None)
    if from_args is not None:  # DeepSpeed refuses a config both in args and in the call: the call's alone
        namespace = copy.copy(namespace)
        namespace.deepspeed_config = None
        given["args"] = namespace
    config = trial_config(script_config(own if own is not None else legacy or from_args), decisions)
    given["config"] = config
    return bound.args, bound.kwargs, config


def decisions_of(run_dir: Path) -> dict[str, Any]:
    """The trial's decisions the launcher wrote for the run (``ds_config.json``)."""
    data = json.loads((run_dir / "ds_config.json").read_text())
    return data if isinstance(data, dict) else {}
