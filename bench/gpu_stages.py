"""The stages of `make gpu-check` (bench/gpu_check.py runs them): what each runs, its
time budget, the `<name>.cuda.json` it leaves and the figures the table shows from it.

A stage's figures are read from the JSON its bench script writes; only the GPU tests and
the `tidal rl` run, which write none, get a writer here. `sample_payload` gives a result of
each stage's shape, so the dry run can check the figures against real key names.
"""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common import RESULTS_DIR, ROOT, write_result

TOTAL_BUDGET_S = 450  # the stages together; `make gpu-check` stays under 8 minutes
RUN_DIR = ROOT / "outputs" / "gpu-check"  # logs, the pytest report, the RL run
GPU_MARK = re.compile(r"pytest\.mark\.gpu\b")
RL_RUN = "rl"  # the `tidal rl` run's name under RUN_DIR

Figures = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Stage:
    name: str
    budget_s: int
    argv: tuple[str, ...]  # after the Python executable, run from the repo root
    result: str  # leaves `<result>.json` in the bench dir
    figures: Figures  # the table's figures, from that JSON
    needs: tuple[str, ...] = ()  # modules the stage imports: missing ones skip it
    collect: Callable[[Stage, Path], None] | None = None  # writes `result` itself


@dataclass
class StageResult:
    stage: str
    status: str  # "ok" | "failed" | "timed out" | "skipped"
    seconds: float
    budget_s: int
    note: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


def gpu_test_files() -> list[str]:
    """Test files with a `gpu` mark, so collection imports only what those tests need."""
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if GPU_MARK.search(p.read_text())
    )


def summary_figures(keys: dict[str, str]) -> Figures:
    """The table's figure `label` is the JSON's `summary[key]`, for each `label: key`."""
    return lambda payload: {label: payload["summary"][key] for label, key in keys.items()}


def memory_figures(payload: dict[str, Any]) -> dict[str, Any]:
    errors = [abs(r["predicted MiB"] / r["peak MiB"] - 1) for r in payload["results"]]
    return {
        "plan error (median)": payload["summary"]["prediction_error_median"],
        "plan error (max)": max(errors),
        "tight peak / vanilla": payload["summary"]["tight_peak_fraction"],
    }


def tests_summary(junit_xml: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """(counts by outcome, one row per test) from a pytest JUnit XML report."""
    root = ElementTree.fromstring(junit_xml)
    rows = []
    for case in root.iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        name = f"{case.get('classname')}::{case.get('name')}"
        rows.append({"test": name, "outcome": outcome, "seconds": float(case.get("time", 0))})
    outcomes = [r["outcome"] for r in rows]
    counts = {
        "passed": outcomes.count("passed"),
        "failed": outcomes.count("failure") + outcomes.count("error"),
        "skipped": outcomes.count("skipped"),
    }
    return counts, rows


def collect_tests(stage: Stage, run_dir: Path) -> None:
    report = run_dir / "gpu_tests.xml"
    if report.exists():
        counts, rows = tests_summary(report.read_text())
        write_result(
            stage.result, config={"command": shlex.join(stage.argv)}, results=rows, summary=counts
        )


def collect_rl(stage: Stage, run_dir: Path) -> None:
    summary_file = run_dir / RL_RUN / "summary.json"
    if summary_file.exists():
        summary = json.loads(summary_file.read_text())
        write_result(
            stage.result,
            config={"command": shlex.join(stage.argv)},
            results=[summary],
            summary=summary,
        )


def stages(run_dir: Path) -> list[Stage]:
    """Every stage, in the order they run: the tests first, then the bench scripts."""
    pytest_argv = ("-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider")
    junit = f"--junitxml={run_dir / 'gpu_tests.xml'}"
    rl_overrides = (
        "--orchestrator.warmup_steps", "4", "--orchestrator.steps", "6",
        "--trainer.device", "cuda", "--inference.device", "cuda",
        "--run.output_dir", str(run_dir), "--run.name", RL_RUN,
    )  # fmt: skip
    service_modules = ("pydantic", "grpc", "grpc_health", "grpc_reflection", "cryptography")
    return [
        Stage(
            name="gpu tests",
            budget_s=60,
            argv=(*pytest_argv, junit, *gpu_test_files()),
            result="gpu_tests.cuda",
            figures=summary_figures({k: k for k in ("passed", "failed", "skipped")}),
            needs=("pytest", "pytest_asyncio", "opentelemetry.sdk", *service_modules),
            collect=collect_tests,
        ),
        Stage(
            name="trainer MFU",
            budget_s=80,
            argv=("bench/trainer.py", "--device", "cuda"),
            result="trainer.cuda",
            figures=summary_figures(
                {"MFU": "mfu", "tokens/s": "tokens_per_s", "peak GiB": "peak_memory_gib"}
            ),
            needs=("pydantic",),
        ),
        Stage(
            name="memory levers vs plan",
            budget_s=100,
            argv=tuple(
                shlex.split("bench/memory.py --device cuda --rounds 1 --steps 2 --head-repeats 0")
            ),
            result="memory.cuda",
            figures=memory_figures,
            needs=("pydantic",),
        ),
        Stage(
            name="native engine vs HF generate",
            budget_s=90,
            argv=tuple(
                shlex.split("bench/inference.py --device cuda --dtypes bfloat16 --repeats 2")
            ),
            result="inference.cuda",
            figures=summary_figures(
                {"x HF (fixed)": "speedup_vs_hf", "x HF (rl)": "speedup_vs_hf_rl"}
            ),
            needs=("pydantic", "transformers"),
        ),
        Stage(
            name="tidal rl, one GPU",
            budget_s=120,
            argv=("-m", "tidal.cli", "rl", "@", "configs/default.toml", *rl_overrides),
            result="rl.cuda",
            figures=summary_figures(
                {"RL steps": "rl_steps", "tokens/s": "tokens_per_s", "start-up s": "startup_s"}
            ),
            needs=("opentelemetry.sdk", *service_modules),
            collect=collect_rl,
        ),
    ]


SAMPLE_JUNIT = """<testsuites><testsuite name="pytest">
<testcase classname="t" name="a" time="1"/>
<testcase classname="t" name="b" time="2"><skipped message="no vllm"/></testcase>
<testcase classname="t" name="c" time="3"><failure message="x"/></testcase>
</testsuite></testsuites>"""


def sample_payload(stage: Stage) -> dict[str, Any]:
    """A result of the shape the stage leaves: a benchmark's committed CUDA result, else
    its CPU twin's; this script's own writers' output for the tests and the RL run."""
    if stage.collect is collect_tests:
        counts, rows = tests_summary(SAMPLE_JUNIT)
        return {"summary": counts, "results": rows}
    if stage.collect is collect_rl:
        from tidal.orchestrator.records.report import RunSummary

        run = RunSummary(
            rl_steps=8, warmup_steps=4, first_reward=0.1, last_reward=0.5,
            total_seconds=30.0, tokens_per_s=900.0, startup_s=12.0,
        )  # fmt: skip
        summary = asdict(run)
        return {"summary": summary, "results": [summary]}
    committed = RESULTS_DIR / f"{stage.result}.json"
    if not committed.exists():
        committed = RESULTS_DIR / f"{stage.result.removesuffix('.cuda')}.json"
    return json.loads(committed.read_text())
