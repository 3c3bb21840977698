"""An HF Trainer script: a tiny LLaMA-style model from a config, trained on a synthetic in-memory dataset.

    deepspeed --num_gpus 2 hf_trainer.py --deepspeed ds_config_hf.json --output_dir out --max_steps 20 \
        --per_device_train_batch_size 2 --use_cpu

An ordinary user script (it knows nothing of dstune): every TrainingArguments field is a flag (HfArgumentParser),
`--deepspeed` names the ds_config, and the Trainer does the rest.
"""

import torch
import transformers


def main() -> None:
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    (args,) = parser.parse_args_into_dataclasses()
    config = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )
    model = transformers.LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(0)
    data = []
    for _ in range(512):
        ids = torch.randint(0, config.vocab_size, (64,), generator=generator)
        data.append({"input_ids": ids, "labels": ids})
    transformers.Trainer(model=model, args=args, train_dataset=data).train()


if __name__ == "__main__":
    main()
