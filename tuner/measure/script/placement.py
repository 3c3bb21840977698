"""Where the user's command reads its ds_config, and the trial's ds_config put there.

The slot is found in this order: ``config_at`` when given (a flag, a dotted key of the first YAML/JSON config file
the command names, or ``FILE:KEY``); the flags DeepSpeed, the HF Trainer and accelerate read (``--deepspeed_config``,
``--deepspeed FILE``, ``--deepspeed_config_file``); a key of a YAML/JSON config file the command names whose value is
a ``.json`` file (LLaMA-Factory's and axolotl's ``deepspeed``, accelerate's ``deepspeed_config_file``); else the
config the script passes to ``deepspeed.initialize`` (:data:`IN_CALL`: the rank hook merges the trial's over it).

The trial's ds_config is the user's with the space's decisions over it (:func:`trial_config`); the command gets a
copy of its argument list with the slot pointing at the run's copy (:func:`place`) and the micro-batch and
accumulation on its own flags where it has them (:func:`batch_targets`): the HF Trainer's (it refuses a ds_config
whose batch keys disagree with its flags), else the ``arg_mappings`` given or found in the ds_config's
``autotuning`` section (DeepSpeed autotuner's form).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import InputError
from tuner.measure.script.command import ScriptCommand

FLAGS = ("--deepspeed_config", "--deepspeed", "--deepspeed_config_file")
FILE_KEYS = ("deepspeed", "deepspeed_config", "deepspeed_config_file")
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
HF_BATCH = {
    "train_micro_batch_size_per_gpu": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
}
# sections that stay the user's whatever the space writes: the model's numerics and the optimizer are theirs
USER_SECTIONS = frozenset({"optimizer", "scheduler", "bf16", "fp16", "bfloat16", "gradient_clipping", "amp"})
OFFLOADS = ("offload_optimizer", "offload_param")  # the space's decision: absent from the trial means none


@dataclass(frozen=True)
class ConfigSlot:
    """Where the ds_config goes: ``argv[index]`` is its path (``key`` None), or the path of a config file whose
    dotted ``key`` names it. ``hf`` says the HF Trainer reads it (its batch flags must agree)."""

    index: int
    key: str | None
    source: str
    hf: bool = False

    @property
    def in_call(self) -> bool:
        """The command names no ds_config: its script passes one to ``deepspeed.initialize`` itself."""
        return self.index < 0


# the script builds its config and passes it to deepspeed.initialize (DeepSpeedExamples' scripts do)
IN_CALL = ConfigSlot(-1, None, "deepspeed.initialize(config=...)")


def _flag_value(argv: tuple[str, ...], flag: str) -> int | None:
    """The index of ``flag``'s value in ``argv`` (``--flag VALUE``; :func:`split_equals` splits ``--flag=VALUE``)."""
    for index, arg in enumerate(argv[:-1]):
        if arg == flag and not argv[index + 1].startswith("-"):
            return index + 1
    return None


def split_equals(argv: tuple[str, ...]) -> tuple[str, ...]:
    """``--flag=value`` items as ``--flag value`` (the same to every argparse-style parser)."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--") and "=" in arg:
            out.extend(arg.split("=", 1))
        else:
            out.append(arg)
    return tuple(out)


def _load(path: Path) -> Any:
    import yaml

    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def _get(data: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _find_key(data: Any, prefix: str = "") -> str | None:
    """The dotted key of the first ``deepspeed``-like entry naming a ``.json`` file."""
    if not isinstance(data, dict):
        return None
    for key, value in data.items():
        if key in FILE_KEYS and isinstance(value, str) and value.endswith(".json"):
            return prefix + key
        found = _find_key(value, f"{prefix}{key}.")
        if found:
            return found
    return None


def _config_files(argv: tuple[str, ...], cwd: Path) -> list[int]:
    return [i for i, arg in enumerate(argv) if arg.endswith(CONFIG_SUFFIXES) and (cwd / arg).is_file()]


def find_slot(command: ScriptCommand) -> ConfigSlot:
    """Where ``command`` reads its ds_config: :data:`IN_CALL` when it names none (its script passes one to
    ``deepspeed.initialize``); :class:`InputError` (``ds-config-at``) when the place given is not there."""
    argv, cwd, given = split_equals(command.argv), Path(command.cwd), command.config_at
    if given and given.startswith("-"):
        index = _flag_value(argv, given)
        if index is None:
            raise InputError("ds-config-at", f"the command has no {given} FILE")
        return ConfigSlot(index, None, given, hf=given == "--deepspeed")
    if given:
        file, _, key = given.rpartition(":")
        files = [i for i in _config_files(argv, cwd) if not file or argv[i] == file]
        for index in files:
            if isinstance(_get(_load(cwd / argv[index]), key), str):
                return ConfigSlot(index, key, f"{argv[index]}: {key}")
        raise InputError("ds-config-at", f"no config file in the command has the key {key!r} naming a ds_config")
    for flag in FLAGS:
        index = _flag_value(argv, flag)
        if index is not None and (flag != "--deepspeed" or _names_config(argv[index], cwd)):
            return ConfigSlot(index, None, flag, hf=flag == "--deepspeed")
    for index in _config_files(argv, cwd):
        data = _load(cwd / argv[index])
        found = _find_key(data)
        if found:
            hf = found.rsplit(".", 1)[-1] == "deepspeed" and any(k in data for k in HF_BATCH.values())
            return ConfigSlot(index, found, f"{argv[index]}: {found}", hf=hf)
    return IN_CALL


def _names_config(value: str, cwd: Path) -> bool:
    """Whether an HF ``--deepspeed VALUE`` is a ds_config: a ``.json`` path, another file, or the config inline."""
    return value.endswith(".json") or (cwd / value).is_file() or inline_config(value) is not None


def inline_config(value: str) -> dict[str, Any] | None:
    """A ds_config given on the command line itself, as DeepSpeed, the HF Trainer and accelerate accept it: JSON text
    or its URL-safe base64; None when ``value`` is neither.

    >>> inline_config(base64.urlsafe_b64encode(b'{"train_batch_size": 8}').decode())
    {'train_batch_size': 8}
    >>> inline_config('{"zero_optimization": {"stage": 2}}'), inline_config("ds.json")
    ({'zero_optimization': {'stage': 2}}, None)
    """
    text = value.strip()
    if not text.startswith("{"):
        try:
            text = base64.urlsafe_b64decode(text.encode("ascii")).decode("utf-8")
        except (ValueError, UnicodeError, binascii.Error):
            return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _read_config(path: Path) -> Any:
    """A ds_config file as DeepSpeed reads it: JSON, or HJSON (comments, trailing commas) where hjson is installed."""
    text = path.read_text()
    try:
        return json.loads(text)
    except ValueError as error:
        try:
            import hjson
        except ImportError:
            raise error from None
        return hjson.loads(text, object_pairs_hook=dict)  # its errors are ValueErrors too


def user_config(command: ScriptCommand, slot: ConfigSlot) -> dict[str, Any]:
    """The user's own ds_config, the base every trial starts from: the file the slot names, or the config inline on
    the command line (JSON or base64); :class:`InputError` when it cannot be read."""
    if slot.in_call:  # read in the script's process, where it reaches deepspeed.initialize
        return {}
    argv, cwd = split_equals(command.argv), Path(command.cwd)
    path = cwd / argv[slot.index]
    if slot.key is not None:
        path = cwd / str(_get(_load(path), slot.key))
    elif not path.is_file() and inline_config(argv[slot.index]) is not None:
        return dict(inline_config(argv[slot.index]) or {})
    try:
        data = _read_config(path)
    except (OSError, ValueError) as error:
        raise InputError("ds-config-at", f"cannot read the ds_config {path}: {error}") from error
    if not isinstance(data, dict):
        raise InputError("ds-config-at", f"{path} is not a JSON object")
    return data


def trial_config(user: dict[str, Any], trial: dict[str, Any]) -> dict[str, Any]:
    """The user's ds_config with the trial's decisions over it: the optimizer, scheduler, precision, gradient
    clipping and every key the space does not write stay the user's; sections the space writes are merged key by key
    (offload is the space's: absent from the trial, none); DeepSpeed autotuner's ``autotuning`` section is dropped.

    >>> user = {"optimizer": {"type": "SGD"}, "autotuning": {"enabled": True},
    ...         "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "stage3_max_live_parameters": 9}}
    >>> mine = trial_config(user, {"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 1}})
    >>> mine["optimizer"], mine["zero_optimization"], "autotuning" in mine
    ({'type': 'SGD'}, {'stage': 1, 'stage3_max_live_parameters': 9}, False)
    """
    config = copy.deepcopy({key: value for key, value in user.items() if key != "autotuning"})
    for key, value in trial.items():
        if key in USER_SECTIONS or key == "autotuning":
            continue
        mine = config.get(key)
        if isinstance(value, dict) and isinstance(mine, dict):
            merged = {k: v for k, v in mine.items() if not (key == "zero_optimization" and k in OFFLOADS)}
            config[key] = {**merged, **copy.deepcopy(value)}
        else:
            config[key] = copy.deepcopy(value)
    return config


def batch_targets(command: ScriptCommand, slot: ConfigSlot, user: dict[str, Any]) -> dict[str, str]:
    """ds_config batch key -> the command's flag (or, for a config file the HF Trainer reads, its key) that must
    carry it: the HF Trainer's flag names where the command itself carries them (accelerate's and DeepSpeed-Chat's
    scripts name their data loader's batch so), the ``arg_mappings`` of the ds_config's ``autotuning`` section and
    those given over them, and the HF Trainer's own over all when it reads the config."""
    argv = split_equals(command.argv)
    targets = {key: f"--{name}" for key, name in HF_BATCH.items() if _flag_value(argv, f"--{name}") is not None}
    section = user.get("autotuning")
    found = section.get("arg_mappings") if isinstance(section, dict) else None
    if isinstance(found, dict):
        targets.update({str(k): str(v) for k, v in found.items() if k in HF_BATCH})
    targets.update(dict(command.arg_mappings))
    if slot.hf:  # the Trainer refuses a ds_config whose batch keys disagree with its own arguments
        prefix = "--" if slot.key is None else ""
        targets.update({key: prefix + name for key, name in HF_BATCH.items()})
    return targets


def command_batch(command: ScriptCommand, slot: ConfigSlot, user: dict[str, Any]) -> dict[str, int]:
    """The micro-batch and accumulation the command itself asks for, on the flags (or config file keys)
    :func:`batch_targets` finds, where they are whole numbers.

    >>> script = ScriptCommand(("python", "t.py", "--deepspeed", "x.json", "--per_device_train_batch_size=2"), ".")
    >>> command_batch(script, ConfigSlot(3, None, "--deepspeed", hf=True), {})
    {'train_micro_batch_size_per_gpu': 2}
    """
    argv, found = split_equals(command.argv), {}
    data = _load(Path(command.cwd) / argv[slot.index]) if slot.key is not None else {}
    for key, target in batch_targets(command, slot, user).items():
        if target.startswith("-"):
            index = _flag_value(argv, target)
            value = argv[index] if index is not None else None
        else:
            value = _get(data, target)
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            found[key] = int(value)
    return found


def _set_flag(argv: list[str], flag: str, value: str) -> None:
    if flag in argv[:-1]:
        argv[argv.index(flag) + 1] = value
    else:
        argv.extend([flag, value])


def _set_key(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[last] = value


def filled(
    argv: tuple[str, ...], slot: ConfigSlot, targets: dict[str, str], config: dict[str, Any], ds_path: str
) -> tuple[list[str], dict[str, Any]]:
    """The command's arguments with the ds_config at ``ds_path`` and the batch sizes of ``config`` on its flags, and
    the keys to set in its config file (a file slot: the ds_config's key and the HF Trainer's batch keys).

    >>> filled(("python", "t.py", "--deepspeed", "ds.json"), ConfigSlot(3, None, "--deepspeed", hf=True),
    ...        {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"},
    ...        {"train_micro_batch_size_per_gpu": 4}, "best.json")
    (['python', 't.py', '--deepspeed', 'best.json', '--per_device_train_batch_size', '4'], {})
    """
    out, edits = list(split_equals(argv)), {}
    if slot.key is not None:
        edits[slot.key] = ds_path
    elif not slot.in_call:  # in the call: the config reaches the script inside deepspeed.initialize
        out[slot.index] = ds_path
    for key, target in targets.items():
        if key not in config:
            continue
        if target.startswith("-"):
            _set_flag(out, target, str(config[key]))
        else:
            edits[target] = config[key]
    return out, edits


def place(command: ScriptCommand, slot: ConfigSlot, config: dict[str, Any], run_dir: Path) -> list[str]:
    """Write ``config`` into ``run_dir`` and return the command's argument list reading it there, the micro-batch
    and accumulation on the command's own flags (or config file keys) where :func:`batch_targets` finds them."""
    ds_path = run_dir / "ds_config.json"
    ds_path.write_text(json.dumps(config, indent=2))
    targets = batch_targets(command, slot, user_config(command, slot))
    argv, edits = filled(command.argv, slot, targets, config, str(ds_path))
    if slot.key is None:  # a flag, or none (the script's process merges the run's file into its own config)
        return argv
    source = Path(command.cwd) / argv[slot.index]
    data = _load(source)
    for key, value in edits.items():
        _set_key(data, key, value)
    copied = run_dir / f"script-config{source.suffix}"
    copied.write_text(json.dumps(data) if source.suffix == ".json" else _dump_yaml(data))
    argv[slot.index] = str(copied)
    return argv


def _dump_yaml(data: Any) -> str:
    import yaml

    return str(yaml.safe_dump(data, sort_keys=False))
