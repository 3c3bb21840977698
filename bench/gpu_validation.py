"""The steps of ``bench/gpu_validation.sh``, one subcommand each, every one appending what it found to
``OUT/validation.jsonl`` (one JSON object per line: ``step``, ``status``, figures) so a run cut short keeps what it
measured. Sized to the card read from the device (``torch.cuda`` total memory and name); ``--dry-run`` runs every
step on CPU ranks with tiny models and a pretend card (nothing it writes is a GPU figure).

Steps (independent truth in brackets):

* ``preflight``: Python, torch, CUDA, NCCL, DeepSpeed, transformers, pydantic versions; dstune's imports; ``nvcc``,
  ``g++``, ``Python.h``, ninja; the card's name and memory [the installed software, the driver];
* ``forked``: one rank forked from the node's fork server trains on CUDA (the server never initialises CUDA) [the
  rank's own report, the server's log];
* ``stages``: ZeRO-0..3 on a model sized to the card, the estimate's allocated / reserved / outside parts and phase
  peaks against ``max_memory_allocated`` / ``max_memory_reserved`` / NVML, predicted against measured tokens/s
  (``bench/gpu_terms_check.py``) [the caching allocator's records, NVML];
* ``oom-pair``: from a dry run of the estimator on this card, the largest micro-batch that fits with room and one the
  estimate puts well past the card; both run: the first must be ``ok``, the second ``oom`` [the device];
* ``nvml``: a bare CUDA context's bytes in NVML against the estimate's ``cuda_context`` term [NVML];
* ``transformers``: a transformers model built from a ``config.json`` trains on the device [the run];
* ``fused-adam``: where ``nvcc`` and ``g++`` are there, DeepSpeed's FusedAdam is built (seconds) and a run trains
  with it, not torch's Adam [the build, the run].

Usage: ``python3 bench/gpu_validation.py STEP --out DIR [--dry-run] [--budget-s S]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

MiB, GiB = 2**20, 2**30
DRY_CARD = ("pretend card (dry run on CPU)", 64 * MiB)


def record(out: Path, step: str, status: str, **figures: Any) -> None:
    """Append one step's result to ``OUT/validation.jsonl`` and print it."""
    line = json.dumps({"step": step, "status": status, "at": time.strftime("%H:%M:%S"), **figures}, default=str)
    with (out / "validation.jsonl").open("a") as sink:
        sink.write(line + "\n")
    print(line, flush=True)


def card(dry: bool) -> tuple[str, int]:
    """The device's name and total memory (the dry run's pretend card on CPU)."""
    if dry:
        return DRY_CARD
    import torch

    props = torch.cuda.get_device_properties(0)
    return props.name, int(props.total_memory)


def device(dry: bool) -> str:
    return "cpu" if dry else "cuda"


def _version(module: str) -> str | None:
    try:
        from importlib import metadata

        return metadata.version(module)
    except Exception:
        return None


def _tool(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    return (done.stdout + done.stderr).strip().splitlines()[-1] if done.returncode == 0 else f"rc {done.returncode}"


def preflight(out: Path, dry: bool) -> None:
    """Versions, imports, compilers and the card: what every later step relies on."""
    import torch

    imports = {}
    for module in ("deepspeed", "transformers", "pydantic", "pydantic_settings", "re2", "tuner.measure.run"):
        try:
            __import__(module)
            imports[module] = "ok"
        except Exception as error:  # each missing import is a finding of its own
            imports[module] = f"{type(error).__name__}: {error}"
    cuda_home = os.environ.get("CUDA_HOME") or ("/usr/local/cuda" if Path("/usr/local/cuda").is_dir() else None)
    nvcc = shutil.which("nvcc") or (str(Path(cuda_home, "bin", "nvcc")) if cuda_home else None)
    name, memory = card(dry)
    record(
        out,
        "preflight",
        "ok" if all(value == "ok" for value in imports.values()) else "error",
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        nccl=str(torch.cuda.nccl.version()) if torch.cuda.is_available() else None,  # a tuple or an int by version
        versions={name_: _version(name_) for name_ in ("deepspeed", "transformers", "pydantic", "typing-extensions")},
        imports=imports,
        nvcc=_tool([nvcc, "--version"]) if nvcc and Path(nvcc).exists() else None,
        gxx=_tool(["g++", "--version"]),
        python_h=Path(sysconfig.get_paths()["include"], "Python.h").is_file(),
        ninja=_tool(["ninja", "--version"]),
        card=name,
        card_bytes=memory,
    )


def _workload(model: str, seq: int, dry: bool, memory: int, precision: str = "bf16") -> Any:
    from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

    cluster = ClusterSpec(gpus_per_node=1, gpu_memory=memory, device=device(dry))  # type: ignore[arg-type]
    return Workload(load_builtin_model(model), cluster, TrainSpec(seq_len=seq, precision="fp32" if dry else precision))


def _trial(micro: int, stage: int, dry: bool, torch_adam: bool = True) -> Any:
    from tuner.workload import TrialConfig

    params: dict[str, Any] = {"lr": 1e-4, **({"torch_adam": True} if torch_adam else {})}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage, **({"reduce_bucket_size": 50_000} if dry else {})},
        "optimizer": {"type": "AdamW", "params": params},
    }
    if not dry:
        config["bf16"] = {"enabled": True}
    return TrialConfig(config)


def _run(workload: Any, trial: Any, timeout: float, **options: Any) -> Any:
    from tuner.measure.options import MeasureOptions
    from tuner.measure.run import run_measurement

    return run_measurement(workload, trial, MeasureOptions("local", warmup=1, steps=2, timeout=timeout, **options))


def _summary(measurement: Any) -> dict[str, Any]:
    rank = measurement.ranks[0] if measurement.ranks else None
    return {
        "error": (measurement.error or "")[-600:],
        "exception_type": measurement.exception_type,
        "tokens_per_s": measurement.tokens_per_s,
        "peak_allocated": rank.peak_allocated if rank else None,
        "peak_reserved": rank.peak_reserved if rank else None,
        "nvml_process_bytes": (rank.true_peak.get("nvml_process_bytes") if rank else None),
        "start_s": (rank.timings.get("start_s") if rank else None),
        "adam": (rank.launch.get("adam") if rank else None),
        "device_name": rank.device_name if rank else None,
    }


def forked(out: Path, dry: bool, budget: float) -> None:
    """One rank forked from the node's fork server trains on the device; the server's log says how it started."""
    from tuner.measure.forkserver.protocol import socket_path

    measurement = _run(_workload("tiny-llama", 128, dry, card(dry)[1]), _trial(2, 2, dry), budget)
    logs = sorted(socket_path("any").parent.glob("*.log"), key=lambda path: path.stat().st_mtime)
    server = logs[-1].read_text(errors="replace")[-800:] if logs else "no fork server log"
    record(out, "forked", measurement.status, server_log=server, **_summary(measurement))


def _fits(model: str, seq: int, micro: int, dry: bool, memory: int) -> tuple[int, bool]:
    from tuner.estimator import estimate

    est = estimate(_workload(model, seq, dry, memory), _trial(micro, 0, dry))
    return est.gpu_total, est.gpu_total <= memory


def oom_pair(out: Path, dry: bool, budget: float) -> None:
    """The largest micro-batch the estimate fits in 85 % of this card, and the smallest it puts 25 % past it."""
    name, memory = card(dry)
    model, seq = ("tiny-llama", 64) if dry else ("qwen2-1.5b", 2048)
    sizes = [2**power for power in range(0, 12)]
    estimates = {micro: _fits(model, seq, micro, dry, memory)[0] for micro in sizes}
    fits = max((m for m in sizes if estimates[m] <= 0.85 * memory), default=None)
    over = min((m for m in sizes if estimates[m] >= 1.25 * memory), default=None)
    plan = {"card": name, "card_bytes": memory, "model": model, "seq": seq, "estimates": estimates}
    for label, micro, expected in (("fits", fits, "ok"), ("over", over, "oom")):
        if micro is None:
            record(out, f"oom-pair:{label}", "skipped", why="no micro-batch up to 2048 lands there", **plan)
            continue
        measurement = _run(_workload(model, seq, dry, memory), _trial(micro, 0, dry), budget / 2)
        status = measurement.status
        agrees = status == expected or (dry and status in ("ok", "oom"))
        record(
            out,
            f"oom-pair:{label}",
            status,
            micro=micro,
            expected=expected,
            agrees=agrees,
            **plan,
            **_summary(measurement),
        )


def stages(out: Path, dry: bool, budget: float) -> None:
    """ZeRO-0..3 sized to the card through ``bench/gpu_terms_check.py`` (its report beside this one), one line per
    stage here: allocated, reserved and outside parts, phase peaks, tokens/s."""
    import gpu_terms_check as terms  # beside this script (bench/ is on the path as its folder)

    name, memory = card(dry)
    terms.CARD["bytes"] = memory
    rows = [terms.judge(case, None if dry else name) for case in terms.stage_cases(memory, dry)]
    started = time.monotonic()
    for index, row in enumerate(rows):
        left = budget - (time.monotonic() - started)
        if left < 20:
            record(out, f"stages:{row.case.name}", "skipped", why="out of time")
            continue
        terms.measure_row(row, timeout=left)
        figures = {key: value for key, value in row.to_dict().items() if key != "status"}
        record(out, f"stages:{row.case.name}", row.status, **figures)
        terms._write(out, rows, f"{index + 1} of {len(rows)} stage configs run on {name}.")


def nvml(out: Path, dry: bool) -> None:
    """A bare CUDA context in this process: NVML's bytes for it against the estimate's ``cuda_context``."""
    from tuner.estimator.runtime.device import device_kind

    context = device_kind(card(dry)[0]).context
    if dry:
        record(out, "nvml", "skipped", why="no device on a dry run", cuda_context_term=context)
        return
    import torch

    from tuner.measure.rank.true_peak import nvml_process_bytes

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    seen = nvml_process_bytes(0)
    ratio = context / seen if seen else None
    record(out, "nvml", "ok" if seen else "error", nvml_bytes=seen, cuda_context_term=context, term_over_nvml=ratio)


def transformers_path(out: Path, dry: bool, budget: float) -> None:
    """A transformers model built from a ``config.json`` (Qwen2, small) trains on the device."""
    from tuner.profile.describe import model_from_config
    from tuner.workload import ClusterSpec, TrainSpec, Workload

    width, vocab = (64, 512) if dry else (512, 32000)
    config = {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": width,
        "intermediate_size": 3 * width, "num_hidden_layers": 2 if dry else 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "vocab_size": vocab, "max_position_embeddings": 4096, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    cluster = ClusterSpec(gpus_per_node=1, gpu_memory=card(dry)[1], device=device(dry))  # type: ignore[arg-type]
    work = Workload(
        model_from_config(config, "qwen2-small"), cluster, TrainSpec(64 if dry else 256, "fp32" if dry else "bf16")
    )
    measurement = _run(work, _trial(2, 2, dry), budget)
    record(out, "transformers", measurement.status, **_summary(measurement))


def fused_adam(out: Path, dry: bool, budget: float) -> None:
    """DeepSpeed's fused Adam built on this node (where compilers are), then a run that trains with it."""
    from tuner.measure.rank.adam_choice import toolchain_missing

    lacking = toolchain_missing("fused_adam", device(dry))
    if lacking:
        record(out, "fused-adam", "skipped", why="lacks " + ", ".join(lacking))
        return
    started = time.monotonic()
    from deepspeed.accelerator import get_accelerator

    get_accelerator().create_op_builder("FusedAdamBuilder").load(verbose=False)  # the CPU one on a dry run
    built_s = time.monotonic() - started
    measurement = _run(_workload("tiny-llama", 128, dry, card(dry)[1]), _trial(2, 2, dry, torch_adam=False), budget)
    record(out, "fused-adam", measurement.status, build_s=round(built_s, 1), **_summary(measurement))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = ("card", "preflight", "forked", "stages", "oom-pair", "nvml", "transformers", "fused-adam")
    parser.add_argument("step", choices=steps, help="card: print the card's memory in bytes (sizes the others)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--budget-s", type=float, default=120.0, help="seconds this step's runs may take")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dry, budget = args.dry_run, args.budget_s
    if args.step == "card":
        print(card(dry)[1])
        return
    try:
        {
            "preflight": lambda: preflight(args.out, dry),
            "forked": lambda: forked(args.out, dry, budget),
            "stages": lambda: stages(args.out, dry, budget),
            "oom-pair": lambda: oom_pair(args.out, dry, budget),
            "nvml": lambda: nvml(args.out, dry),
            "transformers": lambda: transformers_path(args.out, dry, budget),
            "fused-adam": lambda: fused_adam(args.out, dry, budget),
        }[args.step]()
    except Exception as error:  # a step that breaks is a finding: record it, let the next step run
        record(args.out, args.step, "crashed", error=f"{type(error).__name__}: {error}"[-800:])
        raise
    sys.exit(0)


if __name__ == "__main__":
    main()
