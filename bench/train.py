"""Train: fp32 DDP (torchrun), Accelerate (`accelerate launch`) and `cpuaccel run`.

One node x 2 ranks, the same model (TinyLM from examples/train.py: width 384, 4 layers,
about 7.3M parameters), the same data (its corpus), batch 16 x 128 bytes per rank, the
same optimizer (its `adamw`: fused AdamW when available), clipping and lr schedule, and
Accelerate and cpuaccel in the same precision: what `auto` picks on this CPU (bf16 where
it has AMX or AVX512-BF16, fp32 elsewhere):

    fp32 DDP      `torchrun --nproc_per_node 2 bench/train.py --worker ddp`: plain
                  DistributedDataParallel over gloo, fp32
    Accelerate    `accelerate launch --cpu --num_processes 2 --mpirun_hostfile H
                  --mixed_precision P bench/train.py --worker accelerate`: Accelerate
                  1.x's multi-CPU launch (it runs `mpirun -f H -ppn 2 -n 2 python ...`);
                  the script is an ordinary Accelerator(cpu=True) loop with autocast
    Accelerate    the same with `--dynamo_backend inductor`: the model compiled by
      inductor    torch.compile, Accelerate's own best setting where it wins; cpuaccel
                  is compared with the faster of the two Accelerate runs
    cpuaccel      `cpuaccel run --nodes 1 --ppn 2 examples/train.py --log-every 1 ...`;
                  its metrics.jsonl gives step_time, samples_per_s and sync_time per step
    cpuaccel,     the same with the example's `--weights bf16` (under bf16 only): bf16
      weights     parameters, the optimizer updating fp32 master copies
      bf16        (cpuaccel/runtime/master_weights.py); an opt-in setting, so shown
                  beside the default, each compared with the faster Accelerate

What differs is each tool's own: cpuaccel's runtime averages gradients with MPI and runs
attention in whichever of bf16 and fp32 its first call measured faster on this CPU
(cpuaccel/runtime/attention.py); Accelerate's autocast runs it in bf16.

Each figure is the median over the steps after --warmup (compilation falls in those),
then over --rounds rounds in which the runs alternate. The model's FLOP/s is
6 x parameters x tokens/s plus attention (12 x layers x context x width per token),
against the matmul peak of the precision in use on 1 and 2 threads, sized by time
(bench/train_peak.py: seconds on any CPU). `--profile`: one rank's step per op
instead, cpuaccel's and Accelerate's (world of 1).

    .venv/bin/python bench/train.py [--steps 80] [--warmup 10] [--rounds 2] [--profile]
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
from typing import Any

from train_peak import (  # bench/train_peak.py
    cpu_named,
    matmul_peak,
    profile,
    profile_both,
    train_step,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
VENV_BIN = Path(sys.executable).parent
AIM_VS_ACCELERATE = 1.3
TARGET_VS_DDP = 1.8
TARGET_SYNC_SHARE = 0.05
AMX_PEAK_SHARE = 0.5  # of the measured 2-thread bf16 peak, where the CPU has AMX
TOOLS = ["cpuaccel", "accelerate"]  # --profile's
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
    parser.add_argument(
        "--precision", choices=["bf16", "no"], help="default: what auto picks on this CPU"
    )


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

        accelerator = Accelerator(cpu=True, mixed_precision=args.precision)
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
            loss = train_step(model, optimizer, inputs, targets, (autocast, backward, clip))
            scheduler.step()
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


def from_cpuaccel(
    output: str, args: argparse.Namespace, precision: str
) -> dict[str, float | str | None]:
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
        "note": f"{precision}, MPI gradient hook, loss ->{losses[-1]:.2f}, {run_dir.name}",
    }


def cases(args: argparse.Namespace, work: Path, precision: str) -> list[tuple[str, list[str], Any]]:
    """(name, argv, result reader) of the four runs, in the precision in use."""
    shape = [f"--{k}={getattr(args, k)}" for k in ("steps", "batch", "context", "width")]
    shape += [f"--layers={args.layers}", f"--heads={args.heads}", f"--lr={args.lr}"]
    me = str(Path(__file__).resolve())
    ddp_out, acc_out = work / "ddp.json", work / "accelerate.json"
    ddp_argv = [str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node=2", me]
    ddp_argv += ["--worker=ddp", f"--out={ddp_out}", *shape]
    hostfile = work / "hostfile"
    hostfile.write_text("localhost\n")
    acc_argv = [str(VENV_BIN / "accelerate"), "launch", "--cpu", "--num_processes=2"]
    acc_argv += ["--num_machines=1", f"--mpirun_hostfile={hostfile}"]
    acc_argv += [f"--mixed_precision={precision}", "--num_cpu_threads_per_process=1"]
    acc_argv += ["--main_process_port=29611", me, "--worker=accelerate", f"--out={acc_out}"]
    acc_argv += [f"--precision={precision}", *shape]
    ind_out = work / "accelerate-inductor.json"
    ind_argv = [*acc_argv[:2], "--dynamo_backend=inductor", *acc_argv[2:]]
    ind_argv = [w.replace(str(acc_out), str(ind_out)) for w in ind_argv]
    ind_argv = [w.replace("29611", "29612") for w in ind_argv]
    ours = [str(VENV_BIN / "cpuaccel"), "run", "--nodes=1", "--ppn=2", "--master-port=29622"]
    ours += ["examples/train.py", *shape, "--log-every=1"]
    ours += [f"--precision={'bf16' if precision == 'bf16' else 'fp32'}"]
    ours += [f"--checkpoint={work / 'checkpoint.pt'}"]
    shown = "bf16" if precision == "bf16" else "fp32"
    runs = [
        ("fp32 DDP (torchrun)", ddp_argv, lambda out: from_worker(ddp_out, args)),
        (f"Accelerate {shown}", acc_argv, lambda out: from_worker(acc_out, args)),
        (f"Accelerate {shown} inductor", ind_argv, lambda out: from_worker(ind_out, args)),
        ("cpuaccel run", ours, lambda out: from_cpuaccel(out, args, shown)),
    ]
    if precision == "bf16":  # the opt-in setting: bf16 parameters, fp32 masters
        weights = [w.replace("29622", "29623") for w in ours] + ["--weights=bf16"]
        runs.append(
            ("cpuaccel run, weights bf16", weights, lambda out: from_cpuaccel(out, args, shown))
        )
    return runs


def measure(
    args: argparse.Namespace, runs: list[tuple[str, list[str], Any]], env: dict[str, str]
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """--rounds rounds, the runs alternating in each; per run the median over rounds."""
    per: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in runs}
    seconds: dict[str, float] = {}
    for round_ in range(args.rounds):
        for name, argv, parse in runs:
            try:
                output, seconds[name] = run(argv, env)
                per[name].append(parse(output))
                log(f"round {round_ + 1} {name}: {per[name][-1]} ({seconds[name]:.0f} s)")
            except Exception as exc:  # reported in the table, the others go on
                log(f"{name} FAILED: {exc}")
    results: dict[str, dict[str, Any]] = {}
    for name, got in per.items():
        if got:
            # The median of each figure over the rounds (with 2: their mean, never the best).
            merged = dict(got[-1], rounds=[round(float(r["samples_per_s"]), 1) for r in got])
            for key in ("step_time", "samples_per_s", "sync_share"):
                values = [float(r[key]) for r in got if r[key] is not None]
                merged[key] = statistics.median(values) if values else None
            results[name] = merged
    return results, seconds


def print_table(
    args: argparse.Namespace,
    results: dict[str, dict[str, Any]],
    seconds: dict[str, float],
    names: list[str],
    peaks: tuple[float, float],
) -> None:
    params = TinyLM_params(args)
    flop_per_token = 6 * params + 12 * args.layers * args.context * args.width
    print(
        f"\n## bench/train: 1 node x 2 ranks, TinyLM {params / 1e6:.2f}M parameters "
        f"({args.layers} layers, width {args.width}), batch {args.batch} x {args.context} "
        f"per rank, median of steps {args.warmup + 1}-{args.steps}, median of "
        f"{args.rounds} alternating round(s)\n"
    )
    print("| run | samples/s | step time | grad sync share | model TFLOP/s | of 2-thread peak |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        r = results.get(name)
        if r is None:
            print(f"| {name} | failed | | | | |")
            continue
        sps = float(r["samples_per_s"])
        flops = sps * args.context * flop_per_token
        share = "n/a (overlapped)" if r["sync_share"] is None else f"{100 * r['sync_share']:.1f}%"
        print(
            f"| {name} | {sps:.1f} | {1000 * float(r['step_time']):.0f} ms "
            f"| {share} | {flops / 1e12:.3f} | {100 * flops / peaks[1]:.1f}% |"
        )
    print()
    for name in names:
        if name in results:
            print(
                f"- {name}: {results[name]['note']}; samples/s by round {results[name]['rounds']}"
                f"; wall of the last {seconds[name]:.0f} s"
            )


def TinyLM_params(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(EXAMPLES))
    from train import TinyLM  # examples/train.py

    model = TinyLM(args.width, args.layers, args.heads, args.context)
    return sum(p.numel() for p in model.parameters())


def print_checks(
    results: dict[str, dict[str, Any]],
    names: list[str],
    native: bool,
    peak: float,
    flop_per_sample: float,
) -> None:
    print("\n| check | measured | target | result |")
    print("|---|---:|---:|---|")

    def sps(name: str) -> float | None:
        r = results.get(name)
        return None if r is None else float(r["samples_per_s"])

    ddp, eager, compiled, ours = (sps(name) for name in names[:4])
    bf16_weights = sps(names[4]) if len(names) > 4 else None
    known = [(v, n) for v, n in ((eager, names[1]), (compiled, names[2])) if v is not None]
    acc, faster = max(known) if known else (None, "Accelerate")
    from cpuaccel.runtime.precision import cpu_flags

    amx = "amx_bf16" in cpu_flags()

    def row(label: str, value: float | None, target: str, ok: bool | None, fmt: str) -> None:
        shown = "n/a" if value is None else format(value, fmt)
        verdict = "n/a" if ok is None else ("PASS" if ok else "MISS")
        print(f"| {label} | {shown} | {target} | {verdict} |")

    ratio = ours / acc if ours and acc else None
    ok = None if ratio is None else ratio >= AIM_VS_ACCELERATE
    row(f"cpuaccel / the faster Accelerate ({faster})", ratio, f">= {AIM_VS_ACCELERATE}x", ok,
        ".2f")  # fmt: skip
    if len(names) > 4:
        ratio = bf16_weights / acc if bf16_weights and acc else None
        ok = None if ratio is None else ratio >= AIM_VS_ACCELERATE
        row("cpuaccel weights bf16 / the faster Accelerate", ratio,
            f">= {AIM_VS_ACCELERATE}x", ok, ".2f")  # fmt: skip
    if native:
        best = max((v for v in (ours, bf16_weights) if v), default=None)
        share = None if best is None else 100 * best * flop_per_sample / peak
        target = f">= {100 * AMX_PEAK_SHARE:.0f}% (AMX)" if amx else "(no AMX: no target)"
        ok = None if share is None or not amx else share >= 100 * AMX_PEAK_SHARE
        row("the faster cpuaccel, of the 2-thread bf16 peak", share, target, ok, ".1f")
    ratio = ours / ddp if ours and ddp else None
    if native:
        ok = None if ratio is None else ratio >= TARGET_VS_DDP
        row("cpuaccel / fp32 DDP samples/s", ratio, f">= {TARGET_VS_DDP}x", ok, ".2f")
    else:  # both fp32: the 1.8x target is for CPUs with native bf16
        row("cpuaccel / fp32 DDP samples/s", ratio, "(fp32 in use: no target)", None, ".2f")
    share = results.get(names[3], {}).get("sync_share")
    value = None if share is None else 100 * float(share)
    ok = None if share is None else float(share) <= TARGET_SYNC_SHARE
    row(
        "cpuaccel gradient sync share of step",
        value,
        f"<= {100 * TARGET_SYNC_SHARE:.0f}%",
        ok,
        ".1f",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(parser)
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of the runs")
    parser.add_argument("--profile", action="store_true", help="per-op: cpuaccel's, Accelerate's")
    parser.add_argument(
        "--profile-tool", choices=["cpuaccel", "accelerate"], help=argparse.SUPPRESS
    )
    parser.add_argument("--worker", choices=["ddp", "accelerate"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from cpuaccel.runtime.precision import resolve_precision

    # What cpuaccel's default picks on this CPU (--precision: the other kind's path).
    chosen = resolve_precision(args.precision or "auto")
    bf16 = chosen.dtype is not None
    why = chosen.note or f"precision {chosen.name} (--precision {args.precision})"
    if args.profile_tool:
        profile(args, bf16, EXAMPLES, args.profile_tool)
        return
    if args.profile:
        profile_both(args, bf16, Path(__file__))
        return
    began, load_before = time.perf_counter(), os.getloadavg()[0]
    log(f"{why}; measuring the {chosen.name} matmul peak")
    (peak1, n1), (peak2, n2) = matmul_peak(1, bf16), matmul_peak(2, bf16)
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    env = dict(os.environ, NO_COLOR="1", PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    env["HF_HOME"] = str(work / "hf-home")  # no user Accelerate config
    env.pop("OMP_NUM_THREADS", None)
    runs = cases(args, work, "bf16" if bf16 else "no")
    results, seconds = measure(args, runs, env)
    shutil.rmtree(work, ignore_errors=True)
    names = [name for name, _, _ in runs]
    print_table(args, results, seconds, names, (peak1, peak2))
    print(
        f"\nCPU: {cpu_named()}; {why}. {chosen.name} matmul peak (sized by time): "
        f"1 thread {peak1 / 1e12:.3f} TFLOP/s ({n1}^2), 2 threads {peak2 / 1e12:.3f} "
        f"TFLOP/s ({n2}^2)"
    )
    params = TinyLM_params(args)
    flop_per_sample = args.context * (6 * params + 12 * args.layers * args.context * args.width)
    print_checks(results, names, bf16, peak2, flop_per_sample)
    print(
        f"\nload average (1 min) before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f}; "
        f"bench/train wall time: {time.perf_counter() - began:.0f} s"
    )


if __name__ == "__main__":
    main()
