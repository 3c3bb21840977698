"""Train with AutoTP under the HF Trainer on what ``dstune best --format hf`` printed.

Run under torchrun: ``hf_trainer_tp.py DS_JSON NOTES HF_CONFIG_JSON OUT_JSON``. DS_JSON is the export's stdout, used
as is (no ParallelismConfig: accelerate's DeepSpeed path reads ``tensor_parallel.autotp_size`` from it); NOTES its
stderr, whose TrainingArguments line is used. Each rank writes OUT_JSON.RANK: its logged losses, the parameter
elements it holds after AutoTP and the ``train_batch_size`` DeepSpeed derived.
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


def main(ds_path: str, notes_path: str, hf_path: str, out: str) -> None:
    ds_config = json.loads(Path(ds_path).read_text())
    line = next(text for text in Path(notes_path).read_text().splitlines() if text.startswith(ARGS))[len(ARGS) :]
    args_text, _, attention = line.partition("; load the model with attn_implementation=")
    deepspeed.init_distributed(dist_backend="gloo")  # on CPU ranks accelerate leaves it to the script
    hf = json.loads(Path(hf_path).read_text())
    config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    training = transformers.TrainingArguments(
        output_dir=os.path.dirname(out), deepspeed=ds_config, max_steps=2, learning_rate=1e-3, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, max_grad_norm=0.0, **json.loads(args_text),
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention.strip('"'))
    generator = torch.Generator().manual_seed(1)
    data = []
    for _ in range(16):
        ids = torch.randint(0, config.vocab_size, (64,), generator=generator)
        data.append({"input_ids": ids, "labels": ids})
    trainer = transformers.Trainer(model=model, args=training, train_dataset=data)
    trainer.train()  # DeepSpeed checks on the first forward that a tp group's ranks got the same batch
    engine = trainer.model_wrapped
    result = {
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "local": sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters()),
        "train_batch_size": engine.train_batch_size(),
    }
    Path(f"{out}.{os.environ['RANK']}").write_text(json.dumps(result))

    # a clean end: leaving with the process group alive can abort in its threads' destructors at exit ("terminate
    # called without an active exception", SIGABRT after training finished), which torchrun reports as a failure
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
