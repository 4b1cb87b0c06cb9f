"""A small transformer language model, trained data-parallel on the CPU in bf16.

The text is the Python standard library's own source, which every node has, so the
example needs no download. Run it with cpuaccel (each rank gets RANK, WORLD_SIZE,
MASTER_ADDR... from the launcher):

    cpuaccel run --nodes 1 --ppn 2 examples/train.py --steps 60
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sysconfig
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def corpus(limit_bytes: int) -> torch.Tensor:
    """Bytes of the standard library's .py files, in a fixed order (same on every node)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:limit_bytes]), dtype=torch.uint8).long()


class TinyLM(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        block = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 256)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(tokens) + self.position[:n]
        x = self.blocks(x, mask=self.mask[:n, :n], is_causal=True)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank and step")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_* come from cpuaccel
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = corpus(2_000_000)
    model = DistributedDataParallel(TinyLM(args.width, args.layers, 4, args.context))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own samples
    metrics = None
    run_dir = os.environ.get("CPUACCEL_RUN_DIR")
    if rank == 0 and run_dir:
        metrics = open(os.path.join(run_dir, "metrics.jsonl"), "a")  # noqa: SIM115
    first = last = None
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        starts = torch.randint(0, len(data) - args.context - 1, (args.batch,), generator=generator)
        window = torch.stack([data[s : s + args.context + 1] for s in starts.tolist()])
        inputs, targets = window[:, :-1], window[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, 256), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = loss.detach().clone()
        dist.all_reduce(value)
        value = value.item() / world
        first = first if first is not None else value
        last = value
        seconds = time.perf_counter() - t0
        if rank == 0 and (step % 10 == 0 or step == 1):
            rate = args.batch * world / seconds
            print(f"step {step:4d}  loss {value:.3f}  {rate:7.1f} samples/s", flush=True)
        if metrics is not None:
            record = {"step": step, "loss": value, "step_time": seconds,
                      "samples_per_s": args.batch * world / seconds}  # fmt: skip
            metrics.write(json.dumps(record) + "\n")
    if rank == 0:
        total = time.perf_counter() - started
        print(
            f"done: {args.steps} steps on {world} rank(s) in {total:.1f} s; "
            f"loss {first:.3f} -> {last:.3f} (uniform guess: {math.log(256):.3f})"
        )
    if metrics is not None:
        metrics.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
