"""Train with Ulysses sequence parallelism under the HF Trainer on what ``dstune best --format hf`` printed.

Run under torchrun: ``hf_trainer_sp.py DS_JSON NOTES HF_CONFIG_JSON OUT_JSON``. DS_JSON is the export's stdout, used
as is; NOTES its stderr: the TrainingArguments line and the printed snippet, whose ``ParallelismConfig`` is
executed as printed. Rank 0 writes OUT_JSON: the logged losses, the steps, the first step's gradient norm and
whether every weight changed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import deepspeed
import torch
import transformers

ARGS = "TrainingArguments to use with it: "
SNIPPET = "# Ulysses sequence parallelism"


def parallelism_from(notes: str) -> object:
    """Execute the printed snippet up to the model line (the ParallelismConfig), as a user pastes it."""
    start = notes.index(SNIPPET)
    code = notes[start : notes.index("model = ", start)]
    scope: dict = {"WORLD_SIZE": int(os.environ["WORLD_SIZE"])}
    exec(code, scope)
    return scope["parallelism"]


def main(ds_path: str, notes_path: str, hf_path: str, out: str) -> None:
    ds_config = json.loads(Path(ds_path).read_text())
    notes = Path(notes_path).read_text()
    line = next(text for text in notes.splitlines() if text.startswith(ARGS))[len(ARGS) :]
    args_text, _, attention = line.partition("; load the model with attn_implementation=")
    # on CPU ranks (use_cpu) accelerate leaves DeepSpeed's process group to the script; on GPUs it makes it itself
    deepspeed.init_distributed(dist_backend="gloo")
    hf = json.loads(Path(hf_path).read_text())
    config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    training = transformers.TrainingArguments(
        output_dir=os.path.dirname(out),
        deepspeed=ds_config,
        parallelism_config=parallelism_from(notes),
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        max_grad_norm=0.0,
        **json.loads(args_text),
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention.strip('"'))
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    seq = int(os.environ.get("DSTUNE_TEST_SEQ", "64"))
    data = []
    for _ in range(16):
        ids = torch.randint(0, config.vocab_size, (seq,), generator=generator)
        data.append({"input_ids": ids, "labels": ids, "position_ids": torch.arange(seq)})
    trainer = transformers.Trainer(model=model, args=training, train_dataset=data)
    trainer.train()
    changed = [name for name, param in model.named_parameters() if not torch.equal(before[name], param.detach())]
    if int(os.environ.get("RANK", "0")) == 0:
        logs = [entry for entry in trainer.state.log_history if "loss" in entry]
        result = {
            "losses": [entry["loss"] for entry in logs],
            "grad_norms": [entry.get("grad_norm") for entry in logs],
            "steps": trainer.state.global_step,
            "changed": len(changed),
            "params": len(before),
        }
        Path(out).write_text(json.dumps(result))

    # a clean end: leaving with the process group alive can abort in its threads' destructors at exit ("terminate
    # called without an active exception", SIGABRT after training finished), which torchrun reports as a failure
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
