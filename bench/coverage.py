"""Coverage of every causal-LM type transformers ships: exact, refused (with the reason), or not decoder-only.

For each ``model_type`` of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, a tiny config is made from the config class's
defaults, shrunk (``tests/tiny_configs.py``'s :func:`shrunk_config`: few layers, small hidden size, few experts). dstune
describes it (parameters on meta, activations traced under fake tensors, default attention: transformers' own) and
the result is compared with independent truth:

- parameters: the real model ``AutoModelForCausalLM.from_config`` builds on ``meta``, unique parameters counted;
- activations: the same model built on CPU with real tensors, called as a training loop calls it
  (``model(input_ids, labels=...)`` in train mode), every storage autograd saves counted once if alive after the
  forward pass (parameters and buffers excluded).

``exact``: both equal. ``off``: built and estimated, but not equal (the error is given). ``refused``: dstune refuses
the type, with its one-line reason (often the shrunk config's fault: a tiny config of every type is heuristic).
``not decoder-only``: an encoder's or encoder-decoder's causal-LM head. ``no default config``: the config class's
own defaults do not validate.

Run: ``.venv/bin/python bench/coverage.py [--types llama,gpt2] [--out bench/results/coverage.md]``
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the independent instrument: saved_bytes

import torch
import transformers
from saved_bytes import saved_bytes
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from tuner.profile import ProfileCache, model_profile, params_profile
from tuner.profile.hf import quiet
from tuner.workload import WorkloadError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny configs: test helpers
from tiny_configs import decoder_only, shrunk_config

SEQ, BATCH, PRECISION = 32, 2, "fp32"
LIMIT_S = 120  # per type


class Expired(Exception):
    """A type took longer than :data:`LIMIT_S`."""


def real_model(config: dict[str, Any], device: str) -> Any:
    values = {key: value for key, value in config.items() if key != "model_type"}
    hf = transformers.AutoConfig.for_model(config["model_type"], **values)
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.float32)


def real_params(config: dict[str, Any]) -> int:
    return sum(p.numel() for p in real_model(config, "meta").parameters())


def real_saved_bytes(config: dict[str, Any]) -> int:
    torch.manual_seed(0)
    model = real_model(config, "cpu")
    model.train()
    return saved_bytes(model, torch.randint(0, model.config.get_text_config().vocab_size, (BATCH, SEQ)))


def classify(model_type: str, cache: ProfileCache) -> tuple[str, str, float]:
    """(status, detail, seconds) for one model type."""
    start = time.perf_counter()
    if not decoder_only(model_type):
        return "not decoder-only", "", time.perf_counter() - start
    try:
        config = shrunk_config(model_type)
    except Exception as error:  # the config class's own defaults do not validate: no config to describe
        message = " ".join(str(error).split())[:200]
        return "no default config", f"transformers' defaults do not validate: {message}", time.perf_counter() - start
    try:
        profile = params_profile(config, cache)
        traced = model_profile(config, SEQ, PRECISION, None, (False,), cache)
        found = traced.activation_bytes(SEQ, PRECISION, traced.attention, False, BATCH)
        assert found is not None
        estimate = found[0]
    except WorkloadError as error:
        return "refused", str(error), time.perf_counter() - start
    with quiet():
        params = real_params(config)
        saved = real_saved_bytes(config)
    if profile.n_params == params and estimate == saved:
        detail = f"{params:,} params, {saved:,} B saved ({traced.attention})"
        return "exact", detail, time.perf_counter() - start
    detail = f"params {profile.n_params:,} vs {params:,}; activations {estimate:,} vs {saved:,} B"
    if saved:
        detail += f" ({(estimate - saved) / saved:+.3%})"
    return "off", detail, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--out", default="bench/results/coverage.md")
    args = parser.parse_args()
    types = [t for t in args.types.split(",") if t] or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()

    def expired(signum: int, frame: Any) -> None:
        raise Expired

    signal.signal(signal.SIGALRM, expired)
    rows: list[tuple[str, str, str, float]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        cache = ProfileCache(Path(folder))
        for model_type in types:
            signal.alarm(LIMIT_S)
            try:
                status, detail, seconds = classify(model_type, cache)
            except Expired:
                status, detail, seconds = "crashed", f"took more than {LIMIT_S} s", float(LIMIT_S)
            except Exception as error:  # a traceback is a bug of dstune or of the bench: listed as such
                last = traceback.extract_tb(error.__traceback__)[-1]
                where = f"{Path(last.filename).name}:{last.lineno}"
                message = " ".join(str(error).split())[:200]
                status, detail, seconds = "crashed", f"{type(error).__name__} at {where}: {message}", 0.0
            finally:
                signal.alarm(0)
            rows.append((model_type, status, detail, seconds))
            print(f"{model_type:32} {status:18} {seconds:6.1f}s {detail}", flush=True)
            write_table(Path(args.out), rows, time.perf_counter() - started, len(types))


def write_table(path: Path, rows: list[tuple[str, str, str, float]], total: float, planned: int) -> None:
    counts: dict[str, int] = {}
    for _, status, _, _ in rows:
        counts[status] = counts.get(status, 0) + 1
    lines = [
        "# Coverage of transformers' causal-LM types",
        "",
        f"`bench/coverage.py` on transformers {transformers.__version__}, torch {torch.__version__}, "
        f"{len(rows)} of {planned} types in {total / 60:.1f} min (tiny configs from each config class's defaults, "
        f"sequence {SEQ}, micro-batch {BATCH}, {PRECISION}, default attention).",
        "",
        "Truth: parameters of the real model built on `meta`; saved bytes of the real model on CPU called as a "
        "training loop calls it (saved_tensors_hooks, storages de-duplicated). `exact`: both equal.",
        "",
        "| status | types |",
        "|---|---|",
        *(f"| {status} | {count} |" for status, count in sorted(counts.items())),
        "",
        "| model_type | status | detail | s |",
        "|---|---|---|---|",
        *(f"| {t} | {s} | {d.replace('|', '/')} | {sec:.1f} |" for t, s, d, sec in rows),
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
