"""Train a peft LoRA model with the HF Trainer on what ``dstune best --format hf`` printed, as a user would.

Run under torchrun: ``hf_trainer_peft.py DS_JSON NOTES PRESET_JSON OUT_JSON``. DS_JSON is the export's stdout, used
as is; NOTES its stderr, from which the TrainingArguments and the peft LoraConfig are read. Rank 0 writes OUT_JSON:
the logged losses, the steps, the parameters that trained and those that changed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import peft
import torch
import transformers

ARGS = "TrainingArguments to use with it: "
LORA = "peft LoraConfig to wrap the model with (peft.get_peft_model) before the Trainer: "


def note(notes: list[str], prefix: str) -> str:
    return next(line for line in notes if line.startswith(prefix))[len(prefix) :]


def main(ds_path: str, notes_path: str, preset: str, out: str) -> None:
    ds_config = json.loads(Path(ds_path).read_text())
    notes = Path(notes_path).read_text().splitlines()
    args_text, _, attention = note(notes, ARGS).partition("; load the model with attn_implementation=")
    lora = json.loads(note(notes, LORA))
    hf = json.loads(Path(preset).read_text())
    config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    training = transformers.TrainingArguments(
        output_dir=os.path.dirname(out),
        deepspeed=ds_config,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        **json.loads(args_text),
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention.strip('"') or None)
    model = peft.get_peft_model(model, peft.LoraConfig(**lora))
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    data = []
    for _ in range(64):
        ids = torch.randint(0, config.vocab_size, (32,), generator=generator)
        data.append({"input_ids": ids, "labels": ids})
    trainer = transformers.Trainer(model=model, args=training, train_dataset=data)
    trainer.train()
    # DeepSpeed casts the module to the training dtype: compare each weight with its start in that dtype
    changed = [
        name
        for name, param in model.named_parameters()
        if not torch.equal(before[name].to(param.dtype), param.detach())
    ]
    if int(os.environ.get("RANK", "0")) == 0:
        result = {
            "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
            "steps": trainer.state.global_step,
            "trainable": sorted(name for name, param in model.named_parameters() if param.requires_grad),
            "changed": sorted(changed),
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
