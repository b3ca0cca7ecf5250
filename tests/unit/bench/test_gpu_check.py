"""`make gpu-check` on a machine without a GPU: its dry run passes its own checks, the
real run refuses, and its stage runner, skip rule and checks behave as the device run
relies on (real subprocesses; only the stage commands are small stand-ins)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_check = _load()
gpu_stages = sys.modules["gpu_stages"]  # the stage table, imported by gpu_check


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, COLUMNS="200"),
    )


def test_dry_run_lists_every_stage_and_finds_no_problem() -> None:
    out = _run("--dry-run")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 problem(s)" in out.stdout
    for stage in gpu_check.stages(gpu_check.RUN_DIR):
        assert f"- {stage.name}: {stage.budget_s} s, writes {stage.result}.json" in out.stdout
    assert "$ python bench/trainer.py --device cuda" in out.stdout
    assert "$ python -m pytest -m gpu" in out.stdout


def test_stage_budgets_fit_the_total_and_results_are_cuda_json() -> None:
    stages = gpu_check.stages(gpu_check.RUN_DIR)
    assert sum(s.budget_s for s in stages) <= gpu_check.TOTAL_BUDGET_S <= 8 * 60
    assert len({s.result for s in stages}) == len(stages)
    assert all(s.result.endswith(".cuda") for s in stages)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_real_run_refuses_without_cuda_and_writes_nothing(tmp_path: Path) -> None:
    out = _run("--bench-dir", str(tmp_path))
    assert out.returncode == 2
    assert "no CUDA device" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_flag_check_names_an_unknown_flag_and_a_value_outside_choices() -> None:
    problems = gpu_check.flag_problems(("bench/trainer.py", "--device", "tpu", "--devices", "x"))
    assert problems == [
        "bench/trainer.py --device: 'tpu' is not one of ('cpu', 'cuda')",
        "bench/trainer.py does not accept --devices",
    ]
    assert gpu_check.flag_problems(("bench/inference.py", "--device", "cuda")) == []


def test_rl_stage_check_refuses_an_override_the_config_does_not_know() -> None:
    rl = gpu_check.stages(gpu_check.RUN_DIR)[-1]
    bad = gpu_check.Stage(
        rl.name, rl.budget_s, (*rl.argv, "--orchestrator.stepz", "3"), rl.result, rl.figures
    )
    env = gpu_check.child_env(gpu_check.RESULTS_DIR)
    assert gpu_check.stage_problems(rl, env) == []
    [problem] = gpu_check.stage_problems(bad, env)
    assert "orchestrator.stepz" in problem


def _stage(code: str, budget_s: int = 30, **kw: object) -> object:
    figures = gpu_stages.summary_figures({"value": "value"})
    return gpu_check.Stage("probe", budget_s, ("-c", code), "probe.cuda", figures, **kw)


def test_stage_with_a_missing_module_is_skipped_with_the_reason(tmp_path: Path) -> None:
    stage = _stage("raise SystemExit(1)", needs=("json", "no_such_module_here"))
    result = gpu_check.run_stage(stage, tmp_path, tmp_path, left_s=100)
    assert result.status == "skipped"
    assert "no_such_module_here" in result.note


def test_stage_reads_its_figures_from_the_json_it_wrote(tmp_path: Path) -> None:
    write = (
        "import json, os, pathlib; p = pathlib.Path(os.environ['TIDAL_BENCH_DIR'])"
        " / 'probe.cuda.json'; p.write_text(json.dumps({'summary': {'value': 0.25}}))"
    )
    result = gpu_check.run_stage(_stage(write), tmp_path, tmp_path, left_s=100)
    assert (result.status, result.figures) == ("ok", {"value": 0.25})


def test_a_result_older_than_the_stage_is_not_reported(tmp_path: Path) -> None:
    (tmp_path / "probe.cuda.json").write_text(json.dumps({"summary": {"value": 1.0}}))
    os.utime(tmp_path / "probe.cuda.json", (0, 0))
    result = gpu_check.run_stage(_stage("pass"), tmp_path, tmp_path, left_s=100)
    assert result.status == "failed"
    assert result.figures == {}
    assert "no fresh probe.cuda.json" in result.note


def test_a_stage_past_its_budget_is_stopped(tmp_path: Path) -> None:
    stage = _stage("import time; time.sleep(60)", budget_s=2)
    result = gpu_check.run_stage(stage, tmp_path, tmp_path, left_s=100)
    assert result.status == "timed out"
    assert result.seconds < 20


def test_collect_stores_device_results_and_keeps_the_one_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device_out, results = tmp_path / "out", tmp_path / "benchmarks"
    device_out.mkdir()
    results.mkdir()
    (results / "trainer.cuda.json").write_text(json.dumps({"benchmark": "trainer.cuda", "n": 1}))
    (device_out / "trainer.cuda.json").write_text(json.dumps({"benchmark": "trainer.cuda", "n": 2}))
    monkeypatch.setattr(gpu_check, "RESULTS_DIR", results)
    assert gpu_check.collect(device_out) == 0
    assert json.loads((results / "trainer.cuda.json").read_text())["n"] == 2
    assert [h["n"] for h in json.loads((results / "trainer.cuda.history.json").read_text())] == [1]


def test_rl_stage_stores_the_runs_own_summary_as_its_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rl = gpu_check.stages(tmp_path)[-1]
    summary = {"rl_steps": 6, "tokens_per_s": 1537.3, "startup_s": 10.5}
    (tmp_path / gpu_stages.RL_RUN).mkdir()
    (tmp_path / gpu_stages.RL_RUN / "summary.json").write_text(json.dumps(summary))
    monkeypatch.setenv("TIDAL_BENCH_DIR", str(tmp_path))
    rl.collect(rl, tmp_path)
    payload = json.loads((tmp_path / "rl.cuda.json").read_text())
    assert payload["summary"] == summary
    assert rl.figures(payload) == {"RL steps": 6, "tokens/s": 1537.3, "start-up s": 10.5}
