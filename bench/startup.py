"""Start-up and shutdown of `tidal rl @ configs/default.toml`, with where the time goes.

Each run launches the default config (`--orchestrator.steps 5`, so 15 warm-up + 5 RL
steps) as a process and records, relative to the launch:
- when each service logged its milestones (serving, model built, version 0 published and
  loaded, the orchestrator's peers found), from the services' own log lines;
- the CPU seconds of every process of the run (launcher and each service) when the first
  step has started, read from `/proc/<pid>/stat` (less noisy than wall time on a shared
  machine: it is the work, not the wait), and their totals at exit;
- start-up (launch to the first step's start: its completion log line minus its
  seconds, as bench/rl_step.py) and shutdown (last step's line to the launcher's exit),
  measured from outside, and the run's own `summary.json` figures where it writes them
  (tidal.cli.run_timing: the launcher's start to the first step; the last step's end to
  every service exited, before the launcher prints its table).

`--baseline DIR` runs another checkout interleaved with this one (e.g. `git archive` of
the main branch), so before/after are measured under the same load; without its own
`.venv` it runs on this checkout's, its sources first on PYTHONPATH. Writes
docs/benchmarks/startup.json.

    python bench/startup.py [--repeats 3] [--steps 5] [--baseline /path/to/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from common import ROOT, print_table, write_result

TICK = os.sysconf("SC_CLK_TCK")
SERVICES = ("launcher", "weightsync", "trainer", "inference", "orchestrator")
STEP_LINE = re.compile(
    r"^(\S+ \S+) .*tidal\.orchestrator\.loop: step (\d+)/\d+ \S+ .* ([\d.]+)s [\d.]+ tok/s"
)
MILESTONES = {
    "serving on": "serving",
    "model ": "model built",
    "published version 0 ": "version 0 published",
    "loaded version 0 ": "version 0 loaded",
    "packing for": "peers found",
    "shutting down": "SIGTERM",
}


def log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


class ProcessWatch:
    """CPU seconds of the run's processes (found by their command line naming the run)."""

    def __init__(self, launcher: int, run_dir: Path) -> None:
        self.pids = {"launcher": launcher}
        self.run_dir = str(run_dir)
        self.last_cpu: dict[str, float] = {}

    def scan(self) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self.pids.values():
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_text().split("\0")
            except OSError:
                continue
            if "-m" in argv and any(self.run_dir in a for a in argv):
                self.pids[argv[argv.index("-m") + 1].split(".")[-1]] = int(entry)

    def cpu(self) -> dict[str, float]:
        now = {}
        for name, pid in self.pids.items():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                now[name] = (int(fields[11]) + int(fields[12])) / TICK
        self.last_cpu.update(now)
        return now


def run_once(checkout: Path, out: Path, name: str, steps: int) -> dict[str, Any]:
    run_dir = out / name
    command = [
        str(checkout / ".venv" / "bin" / "tidal"), "rl", "@",
        str(checkout / "configs" / "default.toml"), "--run.output-dir", str(out),
        "--run.name", name, "--orchestrator.steps", str(steps),
    ]  # fmt: skip
    env = dict(os.environ)
    if not (checkout / ".venv").exists():  # run it on this checkout's venv, its code first
        command[0] = str(ROOT / ".venv" / "bin" / "tidal")
        sources = [*checkout.glob("services/*/src"), *checkout.glob("libs/*/src"), checkout / "src"]
        env["PYTHONPATH"] = os.pathsep.join(map(str, sources))
    load = os.getloadavg()[0]
    launched = time.time()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=checkout, env=env
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout or []))
    reader.start()
    watch = ProcessWatch(process.pid, run_dir)
    first_cpu: dict[str, float] | None = None
    orchestrator_log = run_dir / "logs" / "orchestrator.log"
    polls = 0
    while process.poll() is None:
        if len(watch.pids) < len(SERVICES) and polls % 10 == 0:
            watch.scan()
        watch.cpu()
        started = orchestrator_log.exists() and " step 1/" in orchestrator_log.read_text(
            errors="replace"
        )
        if first_cpu is None and started:
            first_cpu = watch.cpu()
        polls += 1
        time.sleep(0.02)
    exited = time.time()
    reader.join()
    if process.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{''.join(output)[-3000:]}")
    milestones: dict[str, float] = {}
    for log in sorted((run_dir / "logs").glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            stamp = re.match(r"^(\d{4}-\S+ \S+) ", line)
            for needle, label in MILESTONES.items():
                key = f"{log.stem}: {label}"
                if stamp and needle in line and key not in milestones:
                    milestones[key] = round(log_time(stamp.group(1)) - launched, 3)
    steps_seen = [m for m in map(STEP_LINE.match, orchestrator_log.read_text().splitlines()) if m]
    first, last = steps_seen[0], steps_seen[-1]
    summary_path = run_dir / "summary.json"
    own = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {
        "startup_s": log_time(first.group(1)) - float(first.group(3)) - launched,
        "shutdown_s": exited - log_time(last.group(1)),
        "summary_startup_s": own.get("startup_s"),
        "summary_shutdown_s": own.get("shutdown_s"),
        "cpu_at_first_step": first_cpu,
        "cpu_total": dict(watch.last_cpu),
        "milestones": dict(sorted(milestones.items(), key=lambda kv: kv[1])),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def cpu_median(rows: list[dict[str, Any]], service: str) -> float | None:
    values = [r["cpu_at_first_step"].get(service) for r in rows if r["cpu_at_first_step"]]
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout, run interleaved")
    args = parser.parse_args()
    checkouts = {"this": ROOT}
    if args.baseline is not None:
        checkouts = {"baseline": args.baseline.resolve(), "this": ROOT}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for label, checkout in checkouts.items():
                row = run_once(checkout, Path(tmp), f"{label}-{repeat}", args.steps)
                results.append({"checkout": label, "repeat": repeat, **row})
    table, summary = [], {}
    for label in checkouts:
        rows = [r for r in results if r["checkout"] == label]
        figures = {
            "start-up s": median(rows, "startup_s"),
            "shutdown s": median(rows, "shutdown_s"),
            "summary start-up s": median(rows, "summary_startup_s"),
            "summary shutdown s": median(rows, "summary_shutdown_s"),
            **{f"CPU s {s} @1st step": cpu_median(rows, s) for s in SERVICES},
            "load": median(rows, "load_before"),
        }
        table.append({"checkout": label, **figures})
        summary[label] = figures
    print_table("tidal rl start-up and shutdown (medians)", table)
    config = {"steps": args.steps, "repeats": args.repeats, "baseline": str(args.baseline)}
    print(write_result("startup", config=config, results=results, summary=summary))


if __name__ == "__main__":
    main()
