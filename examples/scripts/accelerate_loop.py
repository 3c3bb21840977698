"""An accelerate training loop with its own model, data and loss.

    accelerate launch --num_processes 2 --use_deepspeed --deepspeed_config_file ds_config_accelerate.json \
        accelerate_loop.py --batch-size 2

An ordinary user script (it knows nothing of dstune): accelerate hands the model, optimizer and data loader to
DeepSpeed in `prepare`, and the loop calls `accelerator.backward` and `optimizer.step`.
"""

import argparse

import torch
from accelerate import Accelerator
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(1024, 128), nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 1024))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1024, (args.steps * args.batch_size, 65))
    loader = torch.utils.data.DataLoader(ids, batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, 1024), batch[:, 1:].reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
