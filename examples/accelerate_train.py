"""An ordinary Hugging Face Accelerate training script, written as for `accelerate launch`.

It knows nothing about cpuaccel: Accelerate finds the distributed setup in the
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR... set on every rank by
cpuaccel's worker, PMI_* by Intel MPI). Run it across nodes with

    cpuaccel run -i inventory.yaml --nodes 2 --ppn 2 examples/accelerate_train.py

Every process prints one JSON line: what Accelerate saw (distributed type, process
counts and indexes), its host, and a checksum of the trained parameters, which is the
same on every process when the gradients were averaged across all of them.
"""

from __future__ import annotations

import argparse
import json
import socket

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def dataset(samples: int, features: int) -> TensorDataset:
    """A fixed regression problem, the same on every process (seeded generator)."""
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(samples, features, generator=generator)
    weights = torch.randn(features, 1, generator=generator)
    targets = torch.tanh(inputs @ weights) + 0.01 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="per process")
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts them)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = DataLoader(dataset(2048, 32), batch_size=args.batch, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    model.train()
    losses: list[float] = []
    batches = iter(loader)
    for _ in range(args.steps):
        inputs, targets = next(batches)
        with accelerator.autocast():
            outputs = model(inputs)
        loss = nn.functional.mse_loss(outputs.float(), targets)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        losses.append(accelerator.gather(loss.detach()).mean().item())

    params = accelerator.unwrap_model(model).parameters()
    checksum = sum(float(p.detach().double().sum()) for p in params)
    state = accelerator.state
    print(
        json.dumps(
            {
                "distributed_type": state.distributed_type.value,
                "num_processes": accelerator.num_processes,
                "process_index": accelerator.process_index,
                "local_process_index": accelerator.local_process_index,
                "mixed_precision": accelerator.mixed_precision,
                "backend": state.backend,
                "hostname": socket.gethostname(),
                "first_loss": round(losses[0], 6),
                "last_loss": round(losses[-1], 6),
                "checksum": round(checksum, 6),
            }
        ),
        flush=True,
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
