"""bench/train.py's parts that are not runs: the CPU named, the matmul peak of the
precision in use (sized by time), and one rank's per-op profile.

A fixed large bf16 matmul would take minutes on a CPU without native bf16 (emulated,
far slower than fp32), so the matrix grows from 256 until one call takes PEAK_CALL_S:
the measure takes seconds on any CPU. Its dtype is the one the runs train in (fp32
where auto picks fp32), so "of peak" compares like with like.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PEAK_CALL_S = 0.2  # one call at least this long: well above timer and thread start noise
PEAK_MAX_N = 4096
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_named() -> str:
    """The CPU's model and the flags that decide precision, e.g. 'AMD EPYC (avx512f ...)'."""
    model, flags = "unknown CPU", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    have = [f for f in FLAGS if f in flags]
    return (
        f"{model} ({', '.join(have) or 'none of ' + ', '.join(FLAGS)}; no amx)"
        if ("amx_tile" not in flags)
        else f"{model} ({', '.join(have)})"
    )


def matmul_peak(threads: int, bf16: bool, repeat: int = 5) -> tuple[float, int]:
    """(FLOP/s, n): the best of `repeat` n x n matmuls in the precision in use on
    `threads` threads, n doubled from 256 until one call takes PEAK_CALL_S."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if bf16 else torch.float32
    try:
        n = 256
        while True:
            a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
            torch.matmul(a, b)  # warm-up: the kernel chosen, pages touched
            start = time.perf_counter()
            torch.matmul(a, b)
            once = time.perf_counter() - start
            if once >= PEAK_CALL_S or n >= PEAK_MAX_N:
                break
            n *= 2
        best = once
        for _ in range(repeat - 1):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - start)
        return 2 * n**3 / best, n
    finally:
        torch.set_num_threads(before)


def profile_table(prof: Any, step_s: float, top: int = 12) -> str:
    """The profile's top ops by self CPU time as a Markdown table (op, self CPU %, calls)."""
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    lines = ["| op | self CPU % | calls |", "|---|---:|---:|"]
    for e in events[:top]:
        lines.append(f"| {e.key} | {100 * e.self_cpu_time_total / total:.1f}% | {e.count} |")
    return "\n".join(lines) + f"\n\n(median step {1000 * step_s:.0f} ms over the profiled steps)"


def profile_both(args: argparse.Namespace, bf16: bool, script: Path) -> None:
    """`script --profile-tool` for cpuaccel then Accelerate, each in its own process (no
    process group or Accelerate state shared), in turn for --rounds rounds."""
    flags = [f"--{k}={getattr(args, k)}" for k in ("batch", "context", "width", "layers")]
    flags += [f"--heads={args.heads}", f"--lr={args.lr}", f"--precision={'bf16' if bf16 else 'no'}"]
    for _ in range(args.rounds):
        for tool in ("cpuaccel", "accelerate"):
            argv = [sys.executable, str(script), *flags, f"--profile-tool={tool}"]
            subprocess.run(argv, check=True, env=dict(os.environ, HF_HOME=tempfile.mkdtemp()))


def profile(args: argparse.Namespace, bf16: bool, examples: Path, tool: str) -> None:
    """One rank (world of one) of examples/train.py's step under `tool` (cpuaccel or
    accelerate), per op, on the threads one of the bench's 2 ranks gets (cores / 2)."""
    sys.path.insert(0, str(examples))
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    from train import TinyLM, Windows, adamw, corpus  # examples/train.py

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    torch.manual_seed(0)
    loader: Any = torch.utils.data.DataLoader(
        Windows(corpus(2_000_000), args.context), batch_size=args.batch, shuffle=True
    )
    model: Any = TinyLM(args.width, args.layers, args.heads, args.context)
    optimizer, _ = adamw(model.parameters(), args.lr)
    if tool == "accelerate":
        from accelerate import Accelerator

        acc = Accelerator(cpu=True, mixed_precision="bf16" if bf16 else "no")
        model, optimizer, loader = acc.prepare(model, optimizer, loader)
        autocast, backward, clip = acc.autocast, acc.backward, acc.clip_grad_norm_
    else:
        import cpuaccel

        ctx = cpuaccel.init(mixed_precision="bf16" if bf16 else "no", seed=0, verbose=False)
        model, optimizer, loader = ctx.prepare(model, optimizer, loader)
        autocast, backward, clip = ctx.autocast, ctx.backward, ctx.clip_grad_norm_
    times: list[float] = []

    def steps(count: int) -> None:
        for _, (inputs, targets) in zip(range(count), loader, strict=False):
            start = time.perf_counter()
            train_step(model, optimizer, inputs, targets, (autocast, backward, clip))
            times.append(time.perf_counter() - start)

    steps(5)
    times.clear()
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        steps(10)
    shapes = {tuple(p.shape) for p in model.parameters()}
    print(
        f"\n## {tool}: one rank's step, per op ({torch.get_num_threads()} thread(s), "
        f"{'bf16' if bf16 else 'fp32'}, {cpu_named()}, load {os.getloadavg()[0]:.2f})\n"
    )
    print(profile_table(prof, statistics.median(times)))
    print(weight_casts(prof, shapes), flush=True)


def train_step(model: Any, optimizer: Any, inputs: Any, targets: Any, hooks: Any) -> Any:
    """One optimizer step, as every run of the training bench takes it (the DDP and
    Accelerate workers, and --profile): ``hooks`` are the tool's (autocast, backward,
    clip_grad_norm_). Returns the loss."""
    from torch import nn

    autocast, backward, clip = hooks
    with autocast():
        logits = model(inputs)
    loss = nn.functional.cross_entropy(logits.float().reshape(-1, 256), targets.reshape(-1))
    backward(loss)
    clip(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def weight_casts(prof: Any, shapes: set[tuple[int, ...]]) -> str:
    """The share of the step in copies of parameter-shaped tensors: autocast's casts of
    the weights and their gradients' casts back, what keeping bf16 weight copies across
    steps (IPEX's master-weight split) could save at most."""
    events = prof.key_averages(group_by_input_shape=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    copies = [e for e in events if e.key == "aten::copy_"]
    weights = [e for e in copies if e.input_shapes and tuple(e.input_shapes[0]) in shapes]
    every = sum(e.self_cpu_time_total for e in copies)
    ours = sum(e.self_cpu_time_total for e in weights)
    return (
        f"copy_ of parameter-shaped tensors (weight casts and their gradients): "
        f"{100 * ours / total:.2f}% of the step, {sum(e.count for e in weights)} calls "
        f"(all copy_: {100 * every / total:.1f}%)"
    )
