"""Training under grad_reduce ordered (the default) and library, side by side.

`cpuaccel run --nodes 1 --ppn 4 examples/train.py` (bench/train.py's model and data),
once with --grad-reduce ordered and once with --grad-reduce library, alternating for
--rounds rounds. Four ranks, because with one or two a sum has only one order and both
settings run the same allreduce. On a 2-core machine the four ranks share the cores
(one thread each), so the step is slower than bench/train.py's; the ratio is what this
bench is for. Each figure: the median over the steps after --warmup (metrics.jsonl's
step_time, sync_time), then the median over the rounds.

    .venv/bin/python bench/reduce_order.py [--steps 20] [--warmup 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from train import VENV_BIN, from_cpuaccel, log, model_args, run  # bench/train.py
from train_peak import cpu_named  # bench/train_peak.py

SETTINGS = ("ordered", "library")
PPN = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(parser)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    parser.set_defaults(steps=20, warmup=5)
    args = parser.parse_args()
    began = time.perf_counter()
    shape = [f"--{k}={getattr(args, k)}" for k in ("steps", "batch", "context", "width")]
    shape += [f"--layers={args.layers}", f"--heads={args.heads}", f"--lr={args.lr}"]
    precision = {"no": "fp32"}.get(args.precision, args.precision or "auto")
    env = dict(os.environ, NO_COLOR="1", PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    env.pop("OMP_NUM_THREADS", None)
    got: dict[str, list[dict[str, object]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="bench-reduce-") as work:
        for round_ in range(args.rounds):
            for name in SETTINGS:
                argv = [
                    str(VENV_BIN / "cpuaccel"), "run", "--nodes=1", f"--ppn={PPN}",
                    "--master-port=29631", f"--grad-reduce={name}", "examples/train.py",
                    *shape, "--log-every=1", f"--precision={precision}",
                    f"--checkpoint={Path(work) / 'checkpoint.pt'}",
                ]  # fmt: skip
                output, seconds = run(argv, env)
                got[name].append(from_cpuaccel(output, args, precision))
                log(f"round {round_ + 1} {name}: {got[name][-1]} ({seconds:.0f} s)")

    def median(name: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in got[name])  # type: ignore[arg-type]

    print(
        f"\n## bench/reduce_order: 1 node x {PPN} ranks, examples/train.py width {args.width}, "
        f"{args.layers} layers, batch {args.batch} x {args.context}; {cpu_named()}\n"
    )
    print("| grad_reduce | step | samples/s | sync share of the step | rounds (samples/s) |")
    print("|---|---:|---:|---:|---|")
    for name in SETTINGS:
        rounds = ", ".join(f"{float(r['samples_per_s']):.1f}" for r in got[name])  # type: ignore[arg-type]
        print(
            f"| {name} | {1000 * median(name, 'step_time'):.0f} ms "
            f"| {median(name, 'samples_per_s'):.1f} | {100 * median(name, 'sync_share'):.1f}% "
            f"| {rounds} |"
        )
    ratio = median("library", "samples_per_s") / median("ordered", "samples_per_s")
    print(f"\nlibrary / ordered throughput: {ratio:.3f}x")
    print(f"bench/reduce_order wall time: {time.perf_counter() - began:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
