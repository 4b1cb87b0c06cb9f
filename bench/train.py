"""Train: fp32 DDP (torchrun), Accelerate bf16 (`accelerate launch`) and `cpuaccel run`.

One node x 2 ranks, the same model (TinyLM from examples/train.py: width 384, 4 layers,
about 7.3M parameters), the same data (its corpus), batch 16 x 128 bytes per rank, the
same optimizer (its `adamw`: fused AdamW when available), clipping and lr schedule:

    fp32 DDP      `torchrun --nproc_per_node 2 bench/train.py --worker ddp`: plain
                  DistributedDataParallel over gloo, fp32
    Accelerate    `accelerate launch --cpu --num_processes 2 --mpirun_hostfile H
                  --mixed_precision bf16 bench/train.py --worker accelerate`: Accelerate
                  1.x's multi-CPU launch (it runs `mpirun -f H -ppn 2 -n 2 python ...`);
                  the script is an ordinary Accelerator(cpu=True) loop with autocast
    cpuaccel      `cpuaccel run --nodes 1 --ppn 2 examples/train.py --log-every 1 ...`;
                  its metrics.jsonl gives step_time, samples_per_s and sync_time per step

Each figure is the median over the steps after --warmup. The model's FLOP/s is
6 x parameters x tokens/s plus attention (12 x layers x context x width per token),
against a measured bf16 matmul peak (4096^2, torch.matmul) on 1 and 2 threads.

    .venv/bin/python bench/train.py [--steps 80] [--warmup 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
VENV_BIN = Path(sys.executable).parent
TARGET_VS_ACCELERATE = 1.15
AIM_VS_ACCELERATE = 1.3
TARGET_VS_DDP = 1.8
TARGET_SYNC_SHARE = 0.05
RUN_DIR = re.compile(r"run directory: (\S+)")


def model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the medians")
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank and step")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)


# ---------------------------------------------------------------------------- workers


def worker(args: argparse.Namespace) -> None:
    """One rank of the fp32 DDP or the Accelerate run; rank 0 writes --out (JSON)."""
    sys.path.insert(0, str(EXAMPLES))
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler
    from train import TinyLM, Windows, adamw, corpus, warmup_cosine  # examples/train.py

    torch.manual_seed(0)
    model = TinyLM(args.width, args.layers, args.heads, args.context)
    dataset = Windows(corpus(2_000_000), args.context)
    if args.worker == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
        loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, drop_last=True)
        model = DistributedDataParallel(model)
        optimizer, kind = adamw(model.parameters(), args.lr)
        info = {"backend": "gloo", "precision": "fp32"}

        def backward(loss: torch.Tensor) -> None:
            loss.backward()

        def autocast():  # type: ignore[no-untyped-def]
            return torch.autocast("cpu", enabled=False)

        clip = nn.utils.clip_grad_norm_
    else:
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True, mixed_precision="bf16")
        rank, world = accelerator.process_index, accelerator.num_processes
        loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, drop_last=True)
        optimizer, kind = adamw(model.parameters(), args.lr)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        backward, autocast, clip = (
            accelerator.backward,
            accelerator.autocast,
            accelerator.clip_grad_norm_,
        )
        state = accelerator.state
        info = {
            "backend": state.backend,
            "precision": accelerator.mixed_precision,
            "distributed_type": str(state.distributed_type),
        }
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(10, args.steps))
    times: list[float] = []
    losses: list[float] = []
    epoch = 0
    model.train()
    last = time.perf_counter()
    while len(times) < args.steps:
        if hasattr(loader, "sampler") and isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        elif hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        for inputs, targets in loader:
            with autocast():
                logits = model(inputs)
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, 256), targets.reshape(-1))
            backward(loss)
            clip(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            now = time.perf_counter()
            times.append(now - last)
            last = now
            if len(times) >= args.steps:
                break
        epoch += 1
    if rank == 0:
        info.update(
            world=world,
            optimizer=kind,
            step_times=times,
            first_loss=losses[0],
            last_loss=losses[-1],
        )
        Path(args.out).write_text(json.dumps(info))
    if args.worker == "ddp":
        torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------------- driver


def log(message: str) -> None:
    print(f"[bench/train {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def matmul_peak(threads: int, n: int = 4096, repeat: int = 8) -> float:
    """FLOP/s of a bf16 n x n matmul on `threads` threads (best of `repeat`)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n).to(torch.bfloat16)
        b = torch.randn(n, n).to(torch.bfloat16)
        for _ in range(2):
            torch.matmul(a, b)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - start)
        return 2 * n**3 / best
    finally:
        torch.set_num_threads(before)


def run(argv: list[str], env: dict[str, str], timeout: float = 600) -> tuple[str, float]:
    log("$ " + " ".join(argv))
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"exit {proc.returncode} after {seconds:.0f} s:\n{tail}")
    return proc.stdout + proc.stderr, seconds


def from_worker(out: Path, args: argparse.Namespace) -> dict[str, float | str | None]:
    data = json.loads(out.read_text())
    times = data["step_times"][args.warmup :]
    step = statistics.median(times)
    return {
        "step_time": step,
        "samples_per_s": args.batch * data["world"] / step,
        "sync_share": None,  # overlapped with backward inside DDP's reducer: not separable
        "note": f"{data['precision']}, {data['backend']}, AdamW {data['optimizer']}, "
        f"loss {data['first_loss']:.2f}->{data['last_loss']:.2f}",
    }


def from_cpuaccel(output: str, args: argparse.Namespace) -> dict[str, float | str | None]:
    match = RUN_DIR.search(output)
    if match:
        run_dir = Path(match.group(1))
    else:
        run_dir = max((ROOT / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if r.get("step", 0) > args.warmup]
    step = statistics.median(r["step_time"] for r in records)
    sync = statistics.median(r["sync_time"] for r in records)
    losses = [r["loss"] for r in records]
    return {
        "step_time": step,
        "samples_per_s": statistics.median(r["samples_per_s"] for r in records),
        "sync_share": sync / step,
        "note": f"bf16, MPI gradient hook, loss ->{losses[-1]:.2f}, {run_dir.name}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(parser)
    parser.add_argument("--worker", choices=["ddp", "accelerate"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    began = time.perf_counter()
    sys.path.insert(0, str(EXAMPLES))
    from train import TinyLM  # examples/train.py

    params = sum(
        p.numel() for p in TinyLM(args.width, args.layers, args.heads, args.context).parameters()
    )
    flop_per_token = 6 * params + 12 * args.layers * args.context * args.width
    log("measuring the bf16 matmul peak")
    peak1, peak2 = matmul_peak(1), matmul_peak(2)

    shape = [
        f"--steps={args.steps}",
        f"--batch={args.batch}",
        f"--context={args.context}",
        f"--width={args.width}",
        f"--layers={args.layers}",
        f"--heads={args.heads}",
        f"--lr={args.lr}",
    ]
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    env = dict(os.environ, NO_COLOR="1", PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    env["HF_HOME"] = str(work / "hf-home")  # no user Accelerate config
    env.pop("OMP_NUM_THREADS", None)
    results: dict[str, dict[str, float | str | None]] = {}
    seconds: dict[str, float] = {}
    me = str(Path(__file__).resolve())

    ddp_out = work / "ddp.json"
    ddp_argv = [
        str(VENV_BIN / "torchrun"),
        "--standalone",
        "--nproc_per_node=2",
        me,
        "--worker=ddp",
        f"--out={ddp_out}",
        *shape,
    ]
    hostfile = work / "hostfile"
    hostfile.write_text("localhost\n")
    acc_out = work / "accelerate.json"
    acc_argv = [
        str(VENV_BIN / "accelerate"),
        "launch",
        "--cpu",
        "--num_processes=2",
        "--num_machines=1",
        f"--mpirun_hostfile={hostfile}",
        "--mixed_precision=bf16",
        "--num_cpu_threads_per_process=1",
        "--main_process_port=29611",
        me,
        "--worker=accelerate",
        f"--out={acc_out}",
        *shape,
    ]
    cpuaccel_argv = [
        str(VENV_BIN / "cpuaccel"),
        "run",
        "--nodes=1",
        "--ppn=2",
        "--master-port=29622",
        "examples/train.py",
        *shape,
        "--log-every=1",
        "--precision=bf16",
        f"--checkpoint={work / 'checkpoint.pt'}",
    ]
    cases = [
        ("fp32 DDP (torchrun)", ddp_argv, lambda out: from_worker(ddp_out, args)),
        ("Accelerate bf16", acc_argv, lambda out: from_worker(acc_out, args)),
        ("cpuaccel run", cpuaccel_argv, lambda out: from_cpuaccel(out, args)),
    ]
    for name, argv, parse in cases:
        try:
            output, seconds[name] = run(argv, env)
            results[name] = parse(output)
            log(f"{name}: {results[name]} ({seconds[name]:.0f} s)")
        except Exception as exc:  # reported in the table, the others go on
            log(f"{name} FAILED: {exc}")
    shutil.rmtree(work, ignore_errors=True)

    print(
        f"\n## bench/train: 1 node x 2 ranks, TinyLM {params / 1e6:.2f}M parameters "
        f"({args.layers} layers, width {args.width}), batch {args.batch} x {args.context} "
        f"per rank, median of steps {args.warmup + 1}-{args.steps}\n"
    )
    print(
        f"bf16 matmul peak (4096^2): 1 thread {peak1 / 1e12:.2f} TFLOP/s, "
        f"2 threads {peak2 / 1e12:.2f} TFLOP/s\n"
    )
    print("| run | samples/s | step time | grad sync share | model TFLOP/s | of 2-thread peak |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, _, _ in cases:
        r = results.get(name)
        if r is None:
            print(f"| {name} | failed | | | | |")
            continue
        sps = float(r["samples_per_s"])  # type: ignore[arg-type]
        flops = sps * args.context * flop_per_token
        share = "n/a (overlapped)" if r["sync_share"] is None else f"{100 * r['sync_share']:.1f}%"
        print(
            f"| {name} | {sps:.1f} | {1000 * float(r['step_time']):.0f} ms "  # type: ignore[arg-type]
            f"| {share} | {flops / 1e12:.3f} | {100 * flops / peak2:.1f}% |"
        )
    print()
    for name, _, _ in cases:
        if name in results:
            print(f"- {name}: {results[name]['note']}; wall {seconds[name]:.0f} s")

    print("\n| check | measured | target | result |")
    print("|---|---:|---:|---|")

    def sps(name: str) -> float | None:
        r = results.get(name)
        return None if r is None else float(r["samples_per_s"])  # type: ignore[arg-type]

    ours, acc, ddp = sps("cpuaccel run"), sps("Accelerate bf16"), sps("fp32 DDP (torchrun)")

    def row(label: str, value: float | None, target: str, ok: bool | None, fmt: str) -> None:
        shown = "n/a" if value is None else format(value, fmt)
        verdict = "n/a" if ok is None else ("PASS" if ok else "MISS")
        print(f"| {label} | {shown} | {target} | {verdict} |")

    ratio = ours / acc if ours and acc else None
    row(
        "cpuaccel / Accelerate samples/s",
        ratio,
        f">= {TARGET_VS_ACCELERATE}x (aim {AIM_VS_ACCELERATE}x)",
        None if ratio is None else ratio >= TARGET_VS_ACCELERATE,
        ".2f",
    )
    ratio = ours / ddp if ours and ddp else None
    row(
        "cpuaccel / fp32 DDP samples/s",
        ratio,
        f">= {TARGET_VS_DDP}x",
        None if ratio is None else ratio >= TARGET_VS_DDP,
        ".2f",
    )
    share = results.get("cpuaccel run", {}).get("sync_share")
    row(
        "cpuaccel gradient sync share of step",
        None if share is None else 100 * float(share),
        f"<= {100 * TARGET_SYNC_SHARE:.0f}%",
        None if share is None else float(share) <= TARGET_SYNC_SHARE,
        ".1f",
    )
    print(f"\nbench/train wall time: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
