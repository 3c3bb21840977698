"""A raw DeepSpeed training loop: its own model, data and loss, launched by `deepspeed`.

    deepspeed --num_gpus 2 raw_deepspeed.py --deepspeed --deepspeed_config ds_config.json

An ordinary user script (it knows nothing of dstune): a small causal language model on random token ids, trained
with a cross-entropy loss it computes itself. The micro-batch comes from the ds_config, as DeepSpeed's own examples do.
"""

import argparse

import deepspeed
import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        block = lambda: nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True, norm_first=True)  # noqa: E731
        self.blocks = nn.ModuleList(block() for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = block(hidden, src_mask=mask, is_causal=True)
        return self.head(hidden)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    torch.manual_seed(0)
    model = TinyLM(vocab=1024, width=args.width, layers=2)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    micro = engine.train_micro_batch_size_per_gpu()
    generator = torch.Generator().manual_seed(engine.global_rank)
    for _ in range(args.steps * engine.gradient_accumulation_steps()):
        ids = torch.randint(0, 1024, (micro, args.seq_len + 1), generator=generator).to(engine.device)
        logits = engine(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
    if engine.global_rank == 0:
        print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
