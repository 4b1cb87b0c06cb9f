"""``cpuaccel bench net``'s tables as text: the nodes, every pair's latency and
bandwidth, each backend's allreduce sweep and the slowest link, in aligned columns.

Rates are decimal GB/s (10^9 bytes), as nccl-tests and the Intel MPI Benchmarks print
them; link rates are Gbit/s, as interfaces are sold; sizes are bytes in powers of 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cpuaccel.netbench.results import NetReport, Pair
from cpuaccel.netbench.sizes import size_text


def speed_text(mbit: int | None) -> str:
    if mbit is None:
        return "unknown"
    return f"{mbit / 1000:g} Gbit/s" if mbit >= 1000 else f"{mbit} Mbit/s"


def rate_text(value: float) -> str:
    """A rate with 2 decimals, or 3 significant digits below 1 (a small message's
    bandwidth is a few kB/s: 0.00 would hide it)."""
    if value >= 1 or value <= 0:
        return f"{value:.2f}"
    return f"{value:.{2 - math.floor(math.log10(value))}f}"


def share_text(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


def columns(rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    """The rows with each column as wide as its widest cell; ``right``: right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if right[i] else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def node_lines(report: NetReport) -> list[str]:
    rows = [("rank", "node", "address", "interface", "speed")]
    for n in report.nodes:
        rows.append(
            (str(n.rank), n.host, n.address or "-", n.interface or "-", speed_text(n.speed_mbit))
        )
    return columns(rows, (True, False, False, False, False))


def pair_lines(report: NetReport) -> list[str]:
    rows = [
        (
            "pair",
            f"latency (us, {size_text(report.latency_bytes)})",
            f"bandwidth (GB/s, {size_text(report.pair_bytes)})",
            "Gbit/s",
            "of interface",
        )
    ]
    for p in report.pairs:
        rows.append(
            (
                p.label(),
                f"{p.latency_s * 1e6:.1f}",
                rate_text(p.bandwidth),
                f"{p.bandwidth * 8:.2f}",
                share_text(p.share),
            )
        )
    return columns(rows, (False, True, True, True, True))


def sweep_lines(report: NetReport) -> list[str]:
    ranks = len(report.nodes)
    lines = [f"allreduce, float32 sum over {ranks} ranks (busbw = algbw x 2(n-1)/n):"]
    rows = [("backend", "size", "time (us)", "algbw (GB/s)", "busbw (GB/s)")]
    skipped = []
    for sweep in report.sweeps:
        if sweep.skipped is not None:
            skipped.append(f"{sweep.backend}: not measured: {sweep.skipped}")
            continue
        for point in sweep.points:
            rows.append(
                (
                    sweep.backend,
                    size_text(point.size),
                    f"{point.seconds * 1e6:.1f}",
                    rate_text(point.algbw),
                    rate_text(point.busbw),
                )
            )
    if len(rows) > 1:
        lines += columns(rows, (False, True, True, True, True))
    return lines + skipped


def slowest_line(pair: Pair | None) -> str:
    if pair is None:
        return "slowest link: none measured"
    rate = f"{rate_text(pair.bandwidth)} GB/s ({pair.bandwidth * 8:.2f} Gbit/s"
    if pair.share is None:
        rate += ", the interface's speed unknown)"
    else:
        rate += f", {share_text(pair.share)} of its {speed_text(pair.speed_mbit)} interface)"
    return f"slowest link: {pair.label()}, {rate}, latency {pair.latency_s * 1e6:.1f} us"


def report_lines(report: NetReport) -> list[str]:
    return [
        *node_lines(report),
        "",
        *pair_lines(report),
        "",
        *sweep_lines(report),
        "",
        slowest_line(report.slowest),
    ]
