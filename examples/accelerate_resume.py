"""A Hugging Face Accelerate script that a restarted ``cpuaccel run`` resumes.

Accelerate does the saving and loading (``save_state``/``load_state``); cpuaccel adds one
call, ``cpuaccel.record_checkpoint(folder, step=...)`` after each save, so that a
restarted job finds the newest state every node holds and names it in
$CPUACCEL_RESUME:

    cpuaccel run --nodes 2 --ppn 2 --max-restarts 2 examples/accelerate_resume.py

- ``ProjectConfiguration(save_on_each_node=True)``: each node writes its own copy (a
  node-local run folder; a copy that lived only on a lost node would be useless);
- the data order resumes exactly: a seedable sampler (the same shuffle for an epoch
  however often it is read), the epoch set from the step, and the batches of the
  interrupted epoch that were done skipped with ``skip_first_batches``.

Rank 0 prints one JSON line at the end: the step it resumed at and the parameters.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import ProjectConfiguration
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cpuaccel


class Progress:
    """The step count, saved and loaded with the state (register_for_checkpointing)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4, help="per process")
    args = parser.parse_args()

    run_dir = os.environ.get("CPUACCEL_RUN_DIR", ".")
    accelerator = Accelerator(
        cpu=True,
        mixed_precision="no",
        project_config=ProjectConfiguration(project_dir=run_dir, save_on_each_node=True),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    torch.manual_seed(0)  # the initial weights, and the sampler's seed
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(64, 8, generator=generator)
    targets = torch.tanh(inputs @ torch.randn(8, 1, generator=generator))
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=args.batch, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    resume = os.environ.get("CPUACCEL_RESUME")  # set by cpuaccel run on a restart
    if resume:
        accelerator.load_state(resume)
    started = progress.step
    while progress.step < args.steps:
        epoch, done = divmod(progress.step, len(loader))
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, done) if done else loader
        for x, y in batches:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            progress.step += 1
            if progress.step % args.save_every == 0:
                folder = os.path.join(run_dir, f"state-{progress.step}")
                accelerator.save_state(folder)
                accelerator.wait_for_everyone()
                cpuaccel.record_checkpoint(folder, step=progress.step)
            if progress.step == args.steps:
                break
    if accelerator.is_main_process:
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        print(json.dumps({"resumed_at": started, "params": params.tolist()}), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
