"""`make gpu-check`: the suite's GPU tests and the CUDA bench scripts, in one timed run.

Each stage runs as its own process under its own time budget (all of them under
`TOTAL_BUDGET_S`), and its figures are read from the JSON its bench script writes
(`<name>.cuda.json`); this script writes only what no bench script does: the GPU tests'
counts, the `tidal rl` run's summary and the table itself. A stage whose prerequisite is
missing is skipped with the reason; without CUDA the real run refuses. `--dry-run` runs
anywhere: it lists each stage's command and budget and checks them against the repo.
The bench docs' README says how a lent GPU machine gets its packages and hands results back.

`python bench/gpu_check.py [--dry-run] [--bench-dir DIR] [--collect DIR]`
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, ROOT, print_table, store_result, write_result
from gpu_stages import (
    RUN_DIR,
    TOTAL_BUDGET_S,
    Stage,
    StageResult,
    sample_payload,
    stages,
)

MIN_STAGE_S = 20  # a stage is not started with less than this left


def source_path() -> str:
    """This tree's source folders, for PYTHONPATH (the tidal packages need no install)."""
    dirs = [ROOT / "src", *sorted(ROOT.glob("libs/*/src")), *sorted(ROOT.glob("services/*/src"))]
    return os.pathsep.join(str(d) for d in dirs)


def missing_module(stage: Stage) -> str | None:
    for module in stage.needs:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{module} is not importable (carry .whl/ from `make gpu-wheels`)"
    return None


def child_env(bench_dir: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (source_path(), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, TIDAL_BENCH_DIR=str(bench_dir), PYTHONUNBUFFERED="1")


def execute(argv: list[str], timeout: float, log: Path, env: dict[str, str]) -> int | None:
    """Run in its own process group (the RL run has children); None if it ran out of time."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(grace)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            return None


def run_stage(stage: Stage, run_dir: Path, bench_dir: Path, left_s: float) -> StageResult:
    skip = missing_module(stage)
    if skip is None and left_s < MIN_STAGE_S:
        skip = f"only {left_s:.0f} s left of the {TOTAL_BUDGET_S} s budget"
    if skip:
        return StageResult(stage.name, "skipped", 0.0, stage.budget_s, skip)
    budget = min(stage.budget_s, left_s)
    log = run_dir / f"{stage.result}.log"
    print(f"== {stage.name}: {budget:.0f} s budget, log {log}", flush=True)
    started = time.time()
    rc = execute([sys.executable, *stage.argv], budget, log, child_env(bench_dir))
    result = StageResult(stage.name, "ok", time.time() - started, stage.budget_s)
    path, unread = bench_dir / f"{stage.result}.json", ""
    try:
        if stage.collect:
            stage.collect(stage, run_dir)
        if path.exists() and path.stat().st_mtime >= started:
            result.figures = stage.figures(json.loads(path.read_text()))
        else:
            unread = f"no fresh {path.name}"
    except (KeyError, OSError, ValueError, ElementTree.ParseError) as e:
        unread = f"{path.name} unreadable: {e!r}"
    if rc != 0 or unread:
        result.status = "timed out" if rc is None else "failed"
        lines = log.read_text(errors="replace").splitlines()
        last = lines[-1][:160] if lines else f"exit {rc}"
        result.note = f"{unread}; {last}" if unread else last
        print("\n".join(lines[-15:]), flush=True)
    print(f"   {result.status} in {result.seconds:.0f} s", flush=True)
    return result


def table_rows(results: list[StageResult]) -> list[dict[str, Any]]:
    def shown(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return [
        {
            "stage": r.stage,
            "status": r.status,
            "s / budget": f"{r.seconds:.0f} / {r.budget_s}",
            "figures": ", ".join(f"{k} {shown(v)}" for k, v in r.figures.items()) or "-",
            "note": r.note or "-",
        }
        for r in results
    ]


def cuda_device() -> str | None:
    """The GPU's name, asked in a child process so this one holds no CUDA context."""
    probe = (
        "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return out.stdout.strip() or None


def run_all(bench_dir: Path) -> int:
    device = cuda_device()
    if device is None:
        print(
            "gpu-check: no CUDA device here (torch sees none); it runs on a GPU machine. "
            "`make gpu-check DRY_RUN=1` checks it anywhere.",
            file=sys.stderr,
        )
        return 2
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    RUN_DIR.mkdir(parents=True)
    os.environ["TIDAL_BENCH_DIR"] = str(bench_dir)
    started, results = time.time(), []
    for stage in stages(RUN_DIR):
        left = TOTAL_BUDGET_S - (time.time() - started)
        results.append(run_stage(stage, RUN_DIR, bench_dir, left))
    rows = table_rows(results)
    print_table(f"gpu-check on {device}", rows)
    ok = all(r.status == "ok" for r in results)
    summary = {"device": device, "all_ok": ok, "total_s": round(time.time() - started, 1)}
    write_result(
        "gpu_check.cuda", config={"budget_s": TOTAL_BUDGET_S}, results=rows, summary=summary
    )
    return 0 if ok else 1


def declared_flags(script: Path) -> dict[str, tuple[str, ...] | None]:
    """`--flag` → its literal `choices` (None: any value) from the script's argparse calls."""
    flags: dict[str, tuple[str, ...] | None] = {}
    for node in ast.walk(ast.parse(script.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant)]
        choices = next((k.value for k in node.keywords if k.arg == "choices"), None)
        literal = None
        if isinstance(choices, ast.Tuple | ast.List):
            literal = tuple(e.value for e in choices.elts if isinstance(e, ast.Constant))
        for name in names:
            if isinstance(name, str) and name.startswith("--"):
                flags[name] = literal
    return flags


def flag_problems(argv: tuple[str, ...]) -> list[str]:
    """What a bench script's parser would refuse in `argv` (the script first)."""
    script = ROOT / argv[0]
    flags, problems, flag = declared_flags(script), [], None
    for token in argv[1:]:
        if token.startswith("--"):
            flag = token
            if flag not in flags:
                problems.append(f"{argv[0]} does not accept {flag}")
            continue
        choices = flags.get(flag) if flag else None
        if choices and token not in choices:
            problems.append(f"{argv[0]} {flag}: {token!r} is not one of {choices}")
    return problems


def stage_problems(stage: Stage, env: dict[str, str]) -> list[str]:
    """Paths that do not exist, flags the target would refuse, a result name off pattern."""
    problems = [
        f"{stage.name}: no {a}"
        for a in stage.argv
        if a.endswith((".py", ".toml")) and not (ROOT / a).exists()
    ]
    if not stage.result.endswith(".cuda"):
        problems.append(f"{stage.name}: result {stage.result} is not a *.cuda.json")
    if stage.argv[0].startswith("bench/"):
        problems += flag_problems(stage.argv)
    elif stage.argv[:2] == ("-m", "pytest"):
        if not any(a.endswith(".py") for a in stage.argv):
            problems.append(f"{stage.name}: no test file has a gpu mark")
        if '"gpu:' not in (ROOT / "pyproject.toml").read_text():
            problems.append(f"{stage.name}: pyproject.toml declares no gpu marker")
    else:  # the tidal CLI resolves the config, every override included, and exits
        out = subprocess.run(
            [sys.executable, *stage.argv, "--dry-run"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            problems.append(f"{stage.name}: its config does not resolve: {out.stderr[-400:]}")
    return problems


def dry_run() -> int:
    run_dir = RUN_DIR
    all_stages, env = stages(run_dir), child_env(RESULTS_DIR)
    print(f"gpu-check plan: {TOTAL_BUDGET_S} s in all, each stage within its own budget")
    for s in all_stages:
        print(f"- {s.name}: {s.budget_s} s, writes {s.result}.json, needs {', '.join(s.needs)}")
        print(f"    $ {shlex.join(['python', *s.argv])}")
    problems = [p for s in all_stages for p in stage_problems(s, env)]
    if sum(s.budget_s for s in all_stages) > TOTAL_BUDGET_S:
        problems.append(f"the stages' budgets add up to more than {TOTAL_BUDGET_S} s")
    results = [StageResult(s.name, "ok", 1.0, s.budget_s) for s in all_stages]
    for stage, result in zip(all_stages, results, strict=True):
        try:
            result.figures = stage.figures(sample_payload(stage))
        except (KeyError, OSError, ValueError) as e:
            problems.append(f"{stage.name}: figures not in its sample result: {e!r}")
    results.append(StageResult("a stage that failed", "failed", 2.0, 1, "exit 1"))
    results.append(StageResult("a stage without its module", "skipped", 0.0, 1, "x missing"))
    print_table("gpu-check table, from sample results", table_rows(results))
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    print(f"gpu-check dry run: {len(problems)} problem(s)")
    return 1 if problems else 0


def collect(folder: Path) -> int:
    """Store a device run's `*.cuda.json` (from `--bench-dir`) here, keeping the history."""
    paths = sorted(folder.glob("*.cuda.json"))
    for path in paths:
        print(f"stored {store_result(json.loads(path.read_text()), RESULTS_DIR)}")
    return 0 if paths else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="list and check; run nothing")
    parser.add_argument("--bench-dir", type=Path, default=RESULTS_DIR, help="where JSON goes")
    parser.add_argument("--collect", type=Path, help="store a device run's JSON files here")
    args = parser.parse_args(argv)
    if args.collect:
        return collect(args.collect)
    return dry_run() if args.dry_run else run_all(args.bench_dir.resolve())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
