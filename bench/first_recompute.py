"""The first recomputed layer's moment: the estimate's backward peak against the true one as layers are added.

Truth: the counting allocator (:mod:`tuner.measure.rank.counting_allocator`, live CPU tensor bytes at torch's CPU
allocator), one process, no DeepSpeed: a transformers ``LlamaForCausalLM`` (hidden 256, MLP 688, 4 query and 2
key-value heads, vocabulary 256 so that the loss is small, bf16, SDPA) with Hugging Face's gradient checkpointing,
sequence 8,192, one forward and backward. The peak of live bytes from the backward's start to its end, less what was
live before the forward (the parameters), is set beside the estimate's backward phase, activations and gradients
(``dstune estimate --device cpu --stage 0 --activation-checkpointing``; the optimizer's states are not in it). Each
layer checkpoints its input, ``8,192 · 256 · 2`` B = 4.19 MB; backward starts at the last layer, whose recomputation
runs while every other checkpoint is held (:mod:`tuner.estimator.activations.first_recompute`).

Run: ``.venv/bin/python bench/first_recompute.py [--layers 2,8,16] [--out bench/results/first_recompute.md]``
(seconds per row; each measurement in a fresh process).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tuner.cli.options import WorkloadFlags, build
from tuner.estimator import estimate

HERE = Path(__file__).parent
SEQ, HIDDEN = 8192, 256
MEASURE = """
import json, sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
from tuner.measure.rank.counting_allocator import counting_allocator
config, build_dir, seq = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]), int(sys.argv[3])
alloc = counting_allocator(build_dir)
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa")).to(torch.bfloat16)
model.gradient_checkpointing_enable()
model.train()
ids = torch.randint(0, config["vocab_size"], (1, seq))
base = alloc.live
loss = model(input_ids=ids, labels=ids).loss
alloc.reset_peak()
loss.backward()
print(json.dumps({"backward_peak": alloc.peak - base}))
"""


def config(layers: int) -> dict[str, object]:
    """The measured model's transformers config."""
    return {
        "model_type": "llama", "vocab_size": 256, "hidden_size": HIDDEN, "intermediate_size": 688,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": SEQ, "tie_word_embeddings": False,
    }  # fmt: skip


def measured(path: Path, folder: Path) -> int:
    """The true backward peak of the config at ``path``, in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), str(folder / "build"), str(SEQ)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(json.loads(done.stdout.strip().splitlines()[-1])["backward_peak"])


def estimated(path: Path) -> tuple[int, int]:
    """(the estimate's backward activations and gradients, its first_recompute_checkpoints) for the config."""
    flags = WorkloadFlags(
        model=str(path), gpus=1, seq_len=SEQ, precision="bf16", stage=0, activation_checkpointing=True,
        device="cpu", attention="sdpa",
    )  # fmt: skip
    est = estimate(*build(flags))
    backward = est.phases["backward"].gpu
    return backward["activations"] + backward["gradients"], est.details.get("first_recompute_checkpoints", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="2,8,16")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "first_recompute.md")
    args = parser.parse_args()
    lines = [
        "# The first recomputed layer's moment: estimate against the true backward peak",
        "",
        f"`bench/first_recompute.py`: transformers Llama, hidden {HIDDEN}, checkpointed, sequence {SEQ:,}, bf16, "
        "one process on CPU; truth: the counting allocator's peak over the backward, less the parameters. MB = 10^6 B.",
        "",
        "| layers | true backward peak MB | estimate MB | error | of it: other checkpoints MB |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        for layers in (int(n) for n in args.layers.split(",")):
            path = folder / f"llama-{layers}.json"
            path.write_text(json.dumps(config(layers)))
            truth, (mine, first) = measured(path, folder), estimated(path)
            error = (mine - truth) / truth
            lines.append(f"| {layers} | {truth / 1e6:.1f} | {mine / 1e6:.1f} | {error:+.1%} | {first / 1e6:.1f} |")
            print(lines[-1], file=sys.stderr)
    notes = args.out.read_text().partition("## Notes\n")[2] if args.out.exists() else ""
    args.out.write_text("\n".join(lines) + "\n" + (f"\n## Notes\n{notes}" if notes else ""))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
