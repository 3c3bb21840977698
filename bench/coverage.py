"""Coverage of every causal-LM type transformers ships, each type classed by what ``dstune estimate`` does with it.

For each ``model_type`` of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, a small config is made from the config class's
defaults (``tests/tiny_configs.py``'s :func:`shrunk_config`: few layers, hidden size 64, few experts), written with
``save_pretrained`` and read back by dstune's own reader (:func:`tuner.workload.load_hf_config`): the file arrives
as a user's ``config.json`` does (transformers 5's ``{"__float__": "Infinity"}`` included). dstune describes it as
the CLI does (parameters on meta, activations traced under fake tensors, the attention transformers resolves) at
sequence 64 and 512, fp32 and bf16, micro-batch 2, and each number is compared with independent truth:

- parameters: the real model transformers builds from the same folder (``from_pretrained`` config) on ``meta``;
- activations: the same model on CPU with real tensors, in the precision, called as a training loop calls it
  (``model(input_ids, labels=...)`` in train mode), every storage autograd saves counted once if alive after the
  forward pass (``tests/saved_bytes.py``: saved_tensors_hooks, parameters and buffers excluded).

``estimated``: dstune estimates it (the error of each row given). ``refused``: dstune refuses it, with its one-line
reason; ``real`` says whether transformers itself builds and trains that file (a forward and backward on CPU).
``no default config``: the config class's own defaults do not validate (no file to write).

Each type is classified in a child process that goes on to the next; a type that kills its process (a native crash,
heap corruption left by the types before it: once, after 39 types, ``corrupted double-linked list``) is a ``crashed``
row with the process's last words, and a new child takes the rest.

Run: ``nice -n 15 .venv/bin/python bench/coverage.py [--types llama,gpt2] [--out bench/results/coverage.md]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the instrument and the tiny configs

import torch
import transformers
from saved_bytes import saved_bytes
from tiny_configs import shrunk_config
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from tuner.profile import ProfileCache, model_profile, params_profile
from tuner.profile.describe import spec_from_profile
from tuner.profile.hf import quiet
from tuner.workload import WorkloadError, load_hf_config

SEQS, BATCH, PRECISIONS = (64, 512), 2, ("fp32", "bf16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LIMIT_S = 300  # per type
Row = tuple[str, str, str, list[float], float]  # type, status, detail, activation errors (%), seconds


class Expired(Exception):
    """A type took longer than :data:`LIMIT_S`."""


def real_model(folder: Path, device: str, dtype: torch.dtype) -> Any:
    """The model transformers builds from the saved folder, as a user's training script would, its parameters in
    ``dtype`` as DeepSpeed's engine casts them (``module.bfloat16()``), except those transformers keeps in fp32 on
    purpose (``_keep_in_fp32_modules_strict``); buffers as transformers made them. XLNet's ``torch.FloatTensor``
    weights, which ``from_config`` leaves in fp32, need the cast to run in bf16 at all."""
    hf = transformers.AutoConfig.from_pretrained(folder)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(hf, dtype=dtype)
    strict = getattr(model, "_keep_in_fp32_modules_strict", None) or ()
    for name, param in model.named_parameters():
        if param.is_floating_point() and not any(re.search(rf"(^|\.){re.escape(key)}($|\.)", name) for key in strict):
            param.data = param.data.to(dtype)
    return model


def real_saved_bytes(folder: Path, seq: int, precision: str) -> int:
    torch.manual_seed(0)
    model = real_model(folder, "cpu", DTYPES[precision])
    model.train()
    vocab = model.config.get_text_config().vocab_size
    return saved_bytes(model, torch.randint(0, min(vocab, 500), (BATCH, seq)))


def trains(folder: Path) -> str:
    """Whether transformers builds and trains the file (one forward and backward on CPU): ``yes``, or its error."""
    try:
        with quiet():
            real_saved_bytes(folder, 16, "fp32")
        return "yes"
    except Exception as error:
        return "no: " + " ".join(f"{type(error).__name__}: {error}".split())[:160]


def classify(model_type: str, root: Path, cache: ProfileCache) -> Row:
    """(type, status, detail, activation errors in %, seconds)."""
    start = time.perf_counter()
    try:
        values = {k: v for k, v in shrunk_config(model_type).items() if k != "model_type"}
        with quiet():
            transformers.AutoConfig.for_model(model_type, **values).save_pretrained(root / model_type)
    except Exception as error:  # the config class's own defaults do not validate: no file to describe
        message = " ".join(str(error).split())[:200]
        return model_type, "no default config", f"transformers: {message}", [], time.perf_counter() - start
    folder = root / model_type
    try:
        config, _ = load_hf_config(str(folder / "config.json"))
        described = params_profile(config, cache)
        params = described.n_params
        limit = spec_from_profile(config, described).position_limit  # a learned position table's positions
        estimates = {}
        for seq in sorted({min(seq, limit) if limit else seq for seq in SEQS}):
            for precision in PRECISIONS:
                traced = model_profile(config, seq, precision, None, (False,), cache)
                found = traced.activation_bytes(seq, precision, traced.attention, False, BATCH)
                assert found is not None
                estimates[seq, precision] = found[0]
    except WorkloadError as error:
        detail = f"{error} [trains in transformers: {trains(folder)}]"
        return model_type, "refused", detail, [], time.perf_counter() - start
    try:
        with quiet():
            real = sum(p.numel() for p in real_model(folder, "meta", torch.float32).parameters())
            truths = {key: real_saved_bytes(folder, *key) for key in estimates}
    except Exception as error:  # dstune estimated what the real model cannot run (a position table it missed)
        message = " ".join(f"{type(error).__name__}: {error}".split())[:200]
        lengths = sorted({seq for seq, _ in estimates})
        detail = (
            f"dstune estimated sequence {lengths} (position limit {limit or 'none'}); the real model fails: {message}"
        )
        return model_type, "real model fails", detail, [], time.perf_counter() - start
    errors = [(estimates[key] - truths[key]) / truths[key] * 100 if truths[key] else 0.0 for key in estimates]
    rows = ", ".join(f"{p}@{s} {e:+.2f}%" for (s, p), e in zip(estimates, errors, strict=True))
    detail = f"params {params:,} vs {real:,}{'' if params == real else ' OFF'}; {traced.attention}; {rows}"
    return model_type, "estimated", detail, errors, time.perf_counter() - start


def run_types(types: list[str], folder: Path, rows_file: Path) -> None:
    """Classify ``types`` in this process, one after the other, each as a JSON line in ``rows_file`` (a ``started``
    line first, so that the parent knows which type a dying process was on)."""
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()

    def expired(signum: int, frame: Any) -> None:
        raise Expired

    signal.signal(signal.SIGALRM, expired)
    cache = ProfileCache(folder / "cache")
    with rows_file.open("a") as out:
        for model_type in types:
            out.write(json.dumps({"started": model_type}) + "\n")
            out.flush()
            signal.alarm(LIMIT_S)
            try:
                row = classify(model_type, folder, cache)
            except Expired:
                row = (model_type, "crashed", f"took more than {LIMIT_S} s", [], float(LIMIT_S))
            except Exception as error:  # a traceback is a bug of dstune or of the bench: listed as such
                last = traceback.extract_tb(error.__traceback__)[-1]
                where = f"{Path(last.filename).name}:{last.lineno}"
                message = " ".join(str(error).split())[:200]
                row = (model_type, "crashed", f"{type(error).__name__} at {where}: {message}", [], 0.0)
            finally:
                signal.alarm(0)
            out.write(json.dumps({"row": row}) + "\n")
            out.flush()


def sweep(types: list[str], out: Path) -> None:
    """Classify every type, in child processes: a type that kills its process (a native crash inside torch or
    transformers, heap corruption left by the types before it) is a ``crashed`` row with the process's last words,
    and a new process goes on with the rest."""
    rows: list[Row] = []
    started = time.perf_counter()
    remaining = list(types)
    with tempfile.TemporaryDirectory() as scratch:
        rows_file, log = Path(scratch) / "rows.jsonl", Path(scratch) / "child.log"
        while remaining:
            with log.open("w") as err:
                command = [sys.executable, __file__, "--child", ",".join(remaining), "--folder", scratch]
                done = subprocess.run([*command, "--rows", str(rows_file)], stdout=err, stderr=err, check=False)
            current = None
            for line in rows_file.read_text().splitlines():
                entry = json.loads(line)
                if "started" in entry:
                    current = entry["started"]
                elif entry["row"][0] not in {row[0] for row in rows}:
                    rows.append(tuple(entry["row"]))  # type: ignore[arg-type]
                    print(f"{rows[-1][0]:32} {rows[-1][1]:18} {rows[-1][4]:6.1f}s {rows[-1][2]}", flush=True)
                    current = None
            if done.returncode != 0 and current is not None and current not in {row[0] for row in rows}:
                words = " ".join(" ".join(log.read_text(errors="replace").splitlines()[-2:]).split())[:160]
                rows.append((current, "crashed", f"the process died ({done.returncode}): {words}", [], 0.0))
                print(f"{current:32} crashed            {rows[-1][2]}", flush=True)
            listed = {row[0] for row in rows}
            remaining = [t for t in types if t not in listed]
            write_table(
                out, sorted(rows, key=lambda row: types.index(row[0])), time.perf_counter() - started, len(types)
            )
            if done.returncode != 0 and current is None:
                break  # died before starting a type: nothing to go on with


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--out", default="bench/results/coverage.md")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_types(args.child.split(","), args.folder, args.rows)
        return
    sweep([t for t in args.types.split(",") if t] or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), Path(args.out))


def write_table(path: Path, rows: list[Row], total: float, planned: int) -> None:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[1]] = counts.get(row[1], 0) + 1
    estimated = [row for row in rows if row[1] == "estimated"]
    exact_params = sum(1 for row in estimated if " OFF" not in row[2])
    errors = [abs(e) for row in estimated for e in row[3]]
    worst = sorted(estimated, key=lambda row: -max((abs(e) for e in row[3]), default=0.0))[:8]
    lines = [
        "# Coverage of transformers' causal-LM types",
        "",
        f"`bench/coverage.py` on transformers {transformers.__version__}, torch {torch.__version__}, "
        f"{len(rows)} of {planned} types in {total / 60:.1f} min (small configs from each config class's defaults, "
        "written with `save_pretrained` and read back as `dstune estimate` reads a `config.json`; sequence "
        f"{' and '.join(map(str, SEQS))} (at most the positions of a learned position table), micro-batch {BATCH}, "
        f"{' and '.join(PRECISIONS)}, the attention transformers resolves).",
        "",
        "Truth: parameters of the real model built from the same folder on `meta`; saved bytes of the real model on "
        "CPU in the precision, called as a training loop calls it (saved_tensors_hooks, storages de-duplicated).",
        "",
        "| status | types |",
        "|---|---|",
        *(f"| {status} | {count} |" for status, count in sorted(counts.items())),
        "",
        f"Estimated: parameters exact for {exact_params} of {len(estimated)}; activations exact to the byte in "
        f"{sum(1 for e in errors if e == 0)} and within 1 % in {sum(1 for e in errors if e <= 1)} of {len(errors)} "
        "rows (type × sequence × precision).",
        "",
        "Worst rows: " + "; ".join(f"{r[0]} {max(r[3], key=abs):+.2f} %" for r in worst if r[3]),
        "",
        "| model_type | status | detail | s |",
        "|---|---|---|---|",
        *(f"| {t} | {s} | {d.replace('|', '/')} | {sec:.1f} |" for t, s, d, _, sec in rows),
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
