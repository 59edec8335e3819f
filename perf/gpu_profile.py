#!/usr/bin/python3
"""The GPU check's per-kernel breakdown and its Nsight Compute summary (scripts/gpu_check.sh, phases
"profile" and "ncu").

  gpu_profile.py breakdown TIMER_JSON --steps N --out MD --top FILE [--count 3]
      The kernel timer's report (perf/kernel_timer.cpp, TRIDENT_KERNEL_TIMER_OUT=*.json) of a run
      under CUDA_LAUNCH_BLOCKING=1, whose warm-up it skipped (TRIDENT_KERNEL_TIMER_SKIP), as a
      markdown table: every kernel label and every library region (the ops::gemm* regions: cuBLAS
      calls) by time, with milliseconds and calls per step and the share of the measured time.
      FILE receives the labels of the --count heaviest Kokkos kernels, one per line (the ncu
      phase's targets; library calls are left out: their kernels are NVIDIA's).

  gpu_profile.py ncu CSV [CSV ...] --out MD
      Nsight Compute's CSV (ncu --csv --section SpeedOfLight, one file per label, named
      ncu_<n>.csv with the label in a first line "# label: ...") as a table per profiled kernel:
      duration, compute (SM) and memory throughput as percentages of the GPU's peak, DRAM
      throughput, grid and block.
"""
import argparse
import csv
import io
import json
import re
import sys

LIBRARY = re.compile(r"^ops::(gemm|sdpa|attention_library)")


def breakdown(a):
    with open(a.timer_json) as f:
        rep = json.load(f)
    rows = [(k["name"], k["type"], k["seconds"], k["calls"]) for k in rep["kernels"]]
    rows += [(r["name"], "library", r["seconds"], r["calls"]) for r in rep["regions"] if LIBRARY.match(r["name"])]
    rows.sort(key=lambda r: -r[2])
    total = rep["total_s"]
    steps = max(a.steps, 1)
    lines = [f"Measured time {1e3 * total / steps:.1f} ms per step over {steps} steps ({rep.get('skip') or 'no warm-up skipped'}); "
             "kernels timed one by one (CUDA_LAUNCH_BLOCKING=1), library rows are cuBLAS calls (ops::gemm* regions).", "",
             "| kernel or library call | kind | ms / step | calls / step | share |", "|---|---|---|---|---|"]
    for name, kind, sec, calls in rows[:a.rows]:
        lines.append(f"| {name} | {kind} | {1e3 * sec / steps:.3f} | {calls / steps:.1f} | "
                     f"{100 * sec / total if total else 0:.1f}% |")
    kernels_s = sum(r[2] for r in rows if r[1] not in ("library", "copy"))
    library_s = sum(r[2] for r in rows if r[1] == "library")
    lines += ["", f"Kokkos kernels {1e3 * kernels_s / steps:.1f} ms per step, library calls "
              f"{1e3 * library_s / steps:.1f} ms, the rest (host, copies, launch gaps) "
              f"{1e3 * max(total - kernels_s - library_s, 0) / steps:.1f} ms."]
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    top = [r[0] for r in rows if r[1] in ("for", "reduce", "scan")][:a.count]
    with open(a.top, "w") as f:
        f.write("".join(t + "\n" for t in top))
    print("\n".join(lines))
    return 0 if rows else 1


METRICS = [("Duration", "duration"), ("Compute (SM) Throughput", "SM %"), ("Memory Throughput", "memory %"),
           ("DRAM Throughput", "DRAM %")]


def ncu(a):
    lines = ["| label | kernel | " + " | ".join(m[1] for m in METRICS) + " | grid | block |",
             "|---|---|" + "---|" * (len(METRICS) + 2)]
    found = 0
    for path in a.csv:
        with open(path, errors="replace") as f:
            text = f.read()
        m = re.search(r"^# label: (.*)$", text, re.M)
        label = m.group(1).strip() if m else path
        body = "\n".join(line for line in text.splitlines() if line.startswith('"'))
        kernels = {}
        for r in csv.DictReader(io.StringIO(body)):
            if "Metric Name" not in r:
                continue
            k = kernels.setdefault(r.get("ID", "0"), {"name": r.get("Kernel Name", "?"), "grid": r.get("Grid Size", ""),
                                                       "block": r.get("Block Size", "")})
            k[r["Metric Name"]] = f"{r.get('Metric Value', '')} {r.get('Metric Unit', '')}".strip()
        if not kernels:
            why = re.findall(r"^==(?:ERROR|WARNING)== .*$", text, re.M)
            lines.append(f"| {label} | no kernel profiled{': ' + why[0][:120] if why else ''} |" + " |" * (len(METRICS) + 2))
            continue
        for k in kernels.values():
            name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
            lines.append(f"| {label} | `{name}` | " + " | ".join(k.get(m[0], "-") for m in METRICS) +
                         f" | {k['grid']} | {k['block']} |")
            found += 1
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if found else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("breakdown")
    b.add_argument("timer_json")
    b.add_argument("--steps", type=int, required=True, help="the steps measured (after the skipped warm-up)")
    b.add_argument("--out", required=True)
    b.add_argument("--top", required=True)
    b.add_argument("--count", type=int, default=3)
    b.add_argument("--rows", type=int, default=25)
    n = sub.add_parser("ncu")
    n.add_argument("csv", nargs="+")
    n.add_argument("--out", required=True)
    a = p.parse_args(argv)
    return breakdown(a) if a.cmd == "breakdown" else ncu(a)


if __name__ == "__main__":
    sys.exit(main())
