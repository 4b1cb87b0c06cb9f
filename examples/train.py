"""A small transformer language model, trained data-parallel on the CPU with cpuaccel.

The text is the Python standard library's own source, read as bytes, which every node
has, so the example needs no download. The runtime (``cpuaccel.init``) picks the
process group's backend, averages gradients with MPI when the job was started by MPI,
runs the model in bf16 autocast where the CPU computes bf16 natively (AMX, AVX512-BF16)
and in fp32 elsewhere (precision auto; --precision bf16 forces it), shards the data,
writes metrics.jsonl into the run directory and saves checkpoints atomically:

    cpuaccel run --nodes 1 --ppn 2 examples/train.py --steps 200
    cpuaccel run --nodes 1 --ppn 2 examples/train.py --steps 300 \\
        --resume <id>          # continue where run <id> ended (its checkpoint.pt)

A restarted job (cpuaccel run --max-restarts) resumes by itself: ``ctx.load()`` loads the
checkpoint that cpuaccel found complete on every node ($CPUACCEL_RESUME), if any.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sysconfig
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import cpuaccel


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


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of the text: (tokens, the same shifted by one)."""

    def __init__(self, data: torch.Tensor, context: int) -> None:
        self.data, self.context = data, context

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.context

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.context
        window = self.data[start : start + self.context + 1]
        return window[:-1], window[1:]


class TinyLM(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        block = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(tokens) + self.position[:n]
        x = self.blocks(x, mask=self.mask[:n, :n], is_causal=True)
        return self.head(self.norm(x))


def adamw(params: Iterable[nn.Parameter], lr: float) -> tuple[torch.optim.Optimizer, str]:
    """AdamW, fused (one kernel for all parameters) when this torch has it on the CPU."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01, fused=True), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01), "foreach"


def warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    """The learning rate's factor at each step: linear warm-up, then cosine to 10%."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


RUN_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")  # cpuaccel run's ids


def resume_path(value: str, run_dir: str | None) -> str:
    """--resume's checkpoint: a path, or a run id for that run's checkpoint.pt, looked
    for beside this run's folder (the head's runs/, where rank 0 saved it), then in
    ./runs/ (a run on this machine, or results brought home with cpuaccel fetch)."""
    if os.path.exists(value) or not RUN_ID.match(value):
        return value
    folders = [os.path.dirname(run_dir)] if run_dir else []
    for runs in [*folders, "runs"]:
        candidate = os.path.join(runs, value, "checkpoint.pt")
        if os.path.isfile(candidate):
            return candidate
    return os.path.join("runs", value, "checkpoint.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps in all")
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank and step")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--clip", type=float, default=1.0, help="max gradient norm")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    parser.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        help="default: what cpuaccel run --mixed-precision exported, else auto (bf16 where "
        "the CPU has AMX or AVX512-BF16, fp32 elsewhere)",
    )
    parser.add_argument(
        "--weights",
        choices=["fp32", "bf16"],
        help="under bf16: fp32 parameters (autocast casts them), or bf16 parameters with "
        "fp32 master copies in the optimizer; default: what cpuaccel run --weights "
        "exported, else fp32",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-bytes", type=int, default=2_000_000)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument(
        "--checkpoint", help="where to save (default: checkpoint.pt in the run directory)"
    )
    parser.add_argument("--save-every", type=int, default=0, help="also save every N steps")
    parser.add_argument(
        "--resume",
        metavar="PATH|RUN_ID",
        help="continue from this checkpoint, or from runs/RUN_ID/checkpoint.pt",
    )
    args = parser.parse_args()

    ctx = cpuaccel.init(
        mixed_precision={"fp32": "no"}.get(args.precision, args.precision),
        seed=args.seed,
        gradient_accumulation_steps=args.grad_accum,
        weights=args.weights,
    )
    data = corpus(args.corpus_bytes)
    loader = DataLoader(
        Windows(data, args.context), batch_size=args.batch, shuffle=True, drop_last=True
    )
    model = TinyLM(args.width, args.layers, args.heads, args.context)
    optimizer, kind = adamw(model.parameters(), args.lr)
    model, optimizer, loader = ctx.prepare(model, optimizer, loader)
    # After prepare: IPEX, when used, may hand back a new optimizer.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.warmup, args.steps))
    # --resume's checkpoint, else the one a restarted cpuaccel run names ($CPUACCEL_RESUME),
    # else none: model, optimizer, schedule and the loader's place in the data come back.
    resume = resume_path(args.resume, ctx.run_dir) if args.resume else None
    state = ctx.load(resume, model=model, optimizer=optimizer, scheduler=scheduler)
    step = int(state["step"]) if state is not None else 0
    if state is not None:
        ctx.print(f"resumed from {resume or ctx.resume_path} at step {step}")
    params = sum(p.numel() for p in model.parameters())
    ctx.samples_per_step = args.batch * ctx.world_size * args.grad_accum
    ctx.print(
        f"model {params / 1e6:.2f}M parameters, AdamW ({kind}), "
        f"{'bf16' if ctx.dtype is not None else 'fp32'} ({ctx.weights} weights), "
        f"{ctx.world_size} rank(s) x {args.batch} x {args.grad_accum} sequences of "
        f"{args.context} bytes per step, {len(loader)} batches per rank and epoch"
    )
    path = args.checkpoint or os.path.join(ctx.run_dir or ".", "checkpoint.pt")
    first = last = None
    started = time.perf_counter()
    start_step = step
    interval, counted = torch.zeros(()), 0  # loss summed over micro-batches since the last print
    while step < args.steps:
        for inputs, targets in loader:  # each pass: the next epoch (or the saved one's rest)
            with ctx.accumulate(model):
                with ctx.autocast():
                    logits = model(inputs)
                loss = nn.functional.cross_entropy(
                    logits.float().reshape(-1, 256), targets.reshape(-1)
                )
                ctx.backward(loss)
                interval += loss.detach()
                counted += 1
                if ctx.sync_gradients:
                    ctx.clip_grad_norm_(model.parameters(), args.clip)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
            if not ctx.sync_gradients:
                continue
            step += 1
            if step % args.log_every == 0 or step in (start_step + 1, args.steps):
                # The mean loss since the last print, over all ranks' batches.
                value = ctx.mean(interval / counted)
                interval, counted = torch.zeros(()), 0
                first = first if first is not None else value
                last = value
                record = ctx.log(step=step, loss=value, lr=scheduler.get_last_lr()[0])
                ctx.print(
                    f"step {step:4d}  loss {value:.4f}  {record['samples_per_s']:7.1f} samples/s"
                    f"  sync {100 * record['sync_share']:4.1f}%"
                )
            if args.save_every and step % args.save_every == 0 and step < args.steps:
                ctx.save(path, model=model, optimizer=optimizer, scheduler=scheduler, step=step)
            if step >= args.steps:
                break
    ctx.save(path, model=model, optimizer=optimizer, scheduler=scheduler, step=step)
    seconds = time.perf_counter() - started
    if first is not None and last is not None:
        ctx.print(
            f"done: steps {start_step + 1}-{step} on {ctx.world_size} rank(s) in {seconds:.1f} s; "
            f"loss {first:.3f} -> {last:.3f} "
            f"(a uniform guess over 256 bytes would score {math.log(256):.3f}); "
            f"gradient sync {ctx.grad_sync} {ctx.grad_sync_seconds:.2f} s; checkpoint {path}"
        )


if __name__ == "__main__":
    main()
