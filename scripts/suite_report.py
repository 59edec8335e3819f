#!/usr/bin/python3
"""Reports on a CTest run of the suite, from the files CTest writes.

  suite_report.py skipped JUNIT_XML
      the tests that were skipped (exit code 77) or not run, each with its reason: the last line
      of its output that mentions a skip, else its last line of output (ctest --output-junit);
  suite_report.py times --build BUILD [--cores N] [--write docs/testing.md] [--timeouts]
      the suite's measured time by group (a test's first label), from BUILD's
      Testing/Temporary/CTestCostData.txt (CTest's running average of each test's wall time) and
      the tests' PROCESSORS and TIMEOUT (ctest --show-only=json-v1): tests, wall seconds,
      core-seconds (wall x PROCESSORS), the longest test; the whole suite's core-seconds and the
      wall time they need at least on N cores. --write replaces the table between the markers
      <!-- suite-times:begin --> and <!-- suite-times:end --> in the given Markdown file.
      --timeouts lists the tests without a TIMEOUT and those whose TIMEOUT is off from about 5x
      their measured time (below 3x, or above 10x and 60 s), and exits 1 when there are any.
  suite_report.py timeouts --junit COLD.xml [--junit WARM.xml ...] [--log CTEST_OUTPUT ...]
                           [--previous cmake/TestTimeouts.cmake --build BUILD] --write cmake/TestTimeouts.cmake
      writes each test's TIMEOUT, 5x the longest of its wall times in the given runs (rounded up
      to 10 s, at least 30 s), as CMake (cmake/TridentTesting.cmake applies it). Tests skipped in
      every run and GoogleTest cases (their TIMEOUT is the unit tests' one) are left out.
      --previous takes the timeouts of an earlier file as measurements too (its TIMEOUT / 5), for
      the tests BUILD still registers (ctest --show-only): a new run raises a timeout, never lowers it,
      and a test no longer registered is dropped.
Exit status 0, or 2 on missing or unreadable inputs.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET


def skipped(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"suite_report: {path}: {e}", file=sys.stderr)
        return 2
    rows = []
    for tc in root.iter("testcase"):
        if tc.get("status") != "notrun":
            continue
        why = tc.find("skipped")
        out = (tc.findtext("system-out") or "").strip().splitlines()
        reason = next((l.strip() for l in reversed(out) if "skip" in l.lower()), out[-1].strip() if out else "")
        rows.append((tc.get("name"), why.get("message", "") if why is not None else "", reason))
    if not rows:
        print("Skipped tests: none")
        return 0
    print(f"Skipped or not run: {len(rows)} test(s)")
    for name, msg, reason in rows:
        kind = "skipped" if "SKIP_RETURN_CODE" in msg else (msg or "not run")
        print(f"  {name} ({kind}): {reason or '(no output)'}")
    return 0


def read_tests(build):
    costs = {}
    path = os.path.join(build, "Testing", "Temporary", "CTestCostData.txt")
    try:
        with open(path) as f:
            for line in f:
                p = line.split()
                # name, completed runs, average seconds; a test that never completed (skipped)
                # has 0 runs and CTest's COST, not a time
                if len(p) == 3 and int(p[1]) > 0:
                    costs[p[0]] = float(p[2])
    except OSError as e:
        sys.exit(f"suite_report: {path}: {e} (run the suite first)")
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"suite_report: ctest --show-only=json-v1 failed in {build}")
    tests = []
    for t in json.loads(out.stdout)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        tests.append({"name": t["name"], "labels": props.get("LABELS") or ["(none)"],
                      "procs": int(props.get("PROCESSORS", 1)), "timeout": props.get("TIMEOUT"),
                      "time": costs.get(t["name"])})
    return tests


def times(a):
    tests = read_tests(a.build)
    groups = {}
    for t in tests:
        if t["time"] is None:
            continue
        g = groups.setdefault(t["labels"][0], {"n": 0, "wall": 0.0, "core": 0.0, "longest": ("", 0.0)})
        g["n"] += 1
        g["wall"] += t["time"]
        g["core"] += t["time"] * t["procs"]
        if t["time"] > g["longest"][1]:
            g["longest"] = (t["name"], t["time"])
    total = sum(g["core"] for g in groups.values())
    unmeasured = [t["name"] for t in tests if t["time"] is None]
    lines = ["| group (first label) | tests | wall s | core-s | longest test (s) |", "|---|---:|---:|---:|---|"]
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["core"]):
        lines.append(f"| {name} | {g['n']} | {g['wall']:.0f} | {g['core']:.0f} | `{g['longest'][0]}` "
                     f"({g['longest'][1]:.0f}) |")
    lines.append(f"| all | {sum(g['n'] for g in groups.values())} | {sum(g['wall'] for g in groups.values()):.0f} | "
                 f"{total:.0f} | at least {total / a.cores / 60:.1f} min of wall time on {a.cores} cores |")
    if unmeasured:
        lines.append("")
        lines.append(f"Not measured in this build's cost data: {len(unmeasured)} test(s).")
    text = "\n".join(lines)
    print(text)
    if a.write:
        with open(a.write) as f:
            doc = f.read()
        begin, end = "<!-- suite-times:begin -->", "<!-- suite-times:end -->"
        if begin not in doc or end not in doc:
            sys.exit(f"suite_report: {a.write} has no {begin} ... {end} block")
        head, rest = doc.split(begin, 1)
        _, tail = rest.split(end, 1)
        with open(a.write + ".tmp", "w") as f:
            f.write(head + begin + "\n" + text + "\n" + end + tail)
        os.replace(a.write + ".tmp", a.write)
        print(f"wrote the table into {a.write}")
    if a.timeouts:
        bad = []
        for t in tests:
            if t["timeout"] is None or float(t["timeout"]) <= 0:
                bad.append(f"  {t['name']}: no TIMEOUT")
            elif t["time"] is not None:
                ratio = float(t["timeout"]) / max(t["time"], 0.01)
                if ratio < 3 or (ratio > 10 and float(t["timeout"]) > 60):
                    bad.append(f"  {t['name']}: TIMEOUT {float(t['timeout']):.0f} s for {t['time']:.1f} s measured "
                               f"({ratio:.0f}x)")
        print(f"timeouts off from about 5x the measured time: {len(bad)}")
        print("\n".join(bad))
        return 1 if bad else 0
    return 0


def junit_times(path):
    """{test: wall seconds} of the tests that ran (not skipped) in one ctest --output-junit file."""
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        if tc.get("status") == "run":
            out[tc.get("name")] = float(tc.get("time") or 0.0)
    return out


# Tests that keep the TIMEOUT they declare: their run time depends on more than the suite's state
KEEP_DECLARED = {
    "cuda_build": "bounds its own build (CUDA_BUILD_LIMIT) within its 1200 s: 3 s warm, minutes after a change",
    "format_changed_files": "may fetch the base commit of a shallow clone, for up to 120 s",
    "host_arch_x86-64-v3": "builds a second tree where it runs (skipped on AVX2 machines)",
    "device_on_host": "builds a second tree where it runs (minutes without its ccache, about 80 s warm)",
    "gpu_kit_rehearsal": "builds a chroot and the kit where it runs",
}


def console_times(path):
    """{test: wall seconds} of the tests that passed or failed in ctest's console output (a run cut
    short leaves no junit file)."""
    out = {}
    pat = re.compile(r"^\s*\d+/\d+ Test +#\d+: (\S+) \.*\s*(?:Passed|\*\*\*Failed|\*\*\*Timeout)\s+([0-9.]+) sec")
    with open(path) as f:
        for line in f:
            m = pat.match(line)
            if m:
                out[m.group(1)] = float(m.group(2))
    return out


def write_timeouts(a):
    measured = {}
    for path in a.junit:
        for name, t in junit_times(path).items():
            measured[name] = max(measured.get(name, 0.0), t)
    for path in a.log or []:
        for name, t in console_times(path).items():
            measured[name] = max(measured.get(name, 0.0), t)
    if a.previous:
        if not a.build:
            sys.exit("suite_report: --previous needs --build (the tests still registered)")
        out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=a.build, stdout=subprocess.PIPE, text=True)
        if out.returncode != 0:
            sys.exit(f"suite_report: ctest --show-only=json-v1 failed in {a.build}")
        registered = {t["name"] for t in json.loads(out.stdout)["tests"]}
        pat = re.compile(r"^set\(TRIDENT_MEASURED_TIMEOUT_(\S+) (\d+)\)")
        try:
            with open(a.previous) as f:
                for line in f:
                    m = pat.match(line)
                    if m and m.group(1) in registered:
                        measured[m.group(1)] = max(measured.get(m.group(1), 0.0), int(m.group(2)) / 5)
        except OSError as e:
            sys.exit(f"suite_report: {a.previous}: {e}")
    new = {}
    for name, t in measured.items():
        if "." in name or name in KEEP_DECLARED:  # GoogleTest cases: the unit tests' TIMEOUT
            continue
        new[name] = max(30, -(-int(5 * t) // 10) * 10)
    with open(a.write + ".tmp", "w") as f:
        f.write("# Each test's TIMEOUT: 5x the longest of its measured wall times, rounded up to 10 s, at least\n"
                "# 30 s; applied by cmake/TridentTesting.cmake (a test not listed keeps the TIMEOUT it declares).\n"
                "# Generated from whole-suite runs on the 2-core development machine, with cold caches (a fresh\n"
                "# machine: the references train, the sample data and packages are fetched) and warm, by:\n"
                "#   scripts/suite_report.py timeouts --junit RUN.xml ... [--log CTEST_OUTPUT ...] --write cmake/TestTimeouts.cmake\n"
                "# Tests skipped in every run are not listed, nor these, which keep their own:\n")
        for n, why in sorted(KEEP_DECLARED.items()):
            f.write(f"#   {n}: {why}\n")
        for n in sorted(new):
            f.write(f"set(TRIDENT_MEASURED_TIMEOUT_{n} {new[n]})\n")
    os.replace(a.write + ".tmp", a.write)
    print(f"wrote {len(new)} timeouts to {a.write}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("skipped")
    s.add_argument("junit")
    t = sub.add_parser("times")
    t.add_argument("--build", required=True)
    t.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    t.add_argument("--write", metavar="MARKDOWN")
    t.add_argument("--timeouts", action="store_true")
    w = sub.add_parser("timeouts")
    w.add_argument("--junit", action="append", default=[], help="a run's ctest --output-junit file (repeatable)")
    w.add_argument("--log", action="append", help="a run's ctest console output, e.g. of a run cut short (repeatable)")
    w.add_argument("--previous", metavar="TIMEOUTS_CMAKE", help="an earlier cmake/TestTimeouts.cmake, taken as measurements")
    w.add_argument("--build", help="with --previous: the build directory whose registered tests are kept")
    w.add_argument("--write", required=True)
    a = p.parse_args()
    if a.cmd == "timeouts":
        return write_timeouts(a)
    if a.cmd == "skipped":
        return skipped(a.junit)
    return times(a)


if __name__ == "__main__":
    sys.exit(main())
