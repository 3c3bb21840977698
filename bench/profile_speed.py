"""Seconds to build a new model profile (parameters on meta, activations traced under fake tensors), uncached.

Each pass profiles the model into an empty cache folder: both checkpointing settings, one precision, one sequence
length. The first pass of the process also pays for importing torch and transformers; the median is over the rest.

``--defaults-of jamba`` profiles the full-size model of transformers' config class defaults instead of ``--model``
(Jamba's: 51.6e9 parameters, recurrent Mamba layers beside attention and MoE).

Run: ``.venv/bin/python bench/profile_speed.py [--model llama-2-7b | --defaults-of jamba] [--seq-len 2048]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tuner.profile import ProfileCache, model_profile
from tuner.workload import load_hf_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-2-7b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--defaults-of", metavar="MODEL_TYPE", help="transformers' default config of this type")
    args = parser.parse_args()
    if args.defaults_of:
        import transformers

        metadata = ("transformers_version", "architectures", "_name_or_path", "dtype")
        defaults = transformers.AutoConfig.for_model(args.defaults_of).to_dict()
        config, args.model = {k: v for k, v in defaults.items() if k not in metadata}, args.defaults_of
    else:
        config, _ = load_hf_config(args.model)
    times = []
    for _ in range(args.passes + 1):
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            model_profile(config, args.seq_len, args.precision, None, (False, True), ProfileCache(Path(folder)))
            times.append(time.perf_counter() - start)
    print(
        f"{args.model} seq {args.seq_len} {args.precision}: first {times[0]:.2f} s (with imports), "
        f"then median {statistics.median(times[1:]):.2f} s (min {min(times[1:]):.2f}, max {max(times[1:]):.2f})"
    )


if __name__ == "__main__":
    main()
