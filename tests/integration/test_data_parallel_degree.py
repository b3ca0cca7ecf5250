"""The orchestrator reads the trainer's data-parallel degree from the real trainer's
GetStatus at start-up: a config restating a different degree stops the run before the
first step, naming both settings (a single-process trainer reports 1), and is not
restarted: the orchestrator exits 2 (a configuration error), which supervision leaves."""

from __future__ import annotations


def test_a_data_parallel_setting_the_trainer_does_not_have_stops_the_run(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch("--orchestrator.packing.data-parallel-ranks", "2", "--orchestrator.steps", "2")
    assert run.process.wait(timeout=240) == 1
    out = run.output()
    trainer = run.wait_for_config()["endpoints"]["trainer"]
    assert (
        f"orchestrator.packing.data_parallel_ranks = 2 but the trainer at {trainer} trains "
        "with 1 data-parallel rank(s)"
    ) in out, out[-3000:]
    assert "unset orchestrator.packing.data_parallel_ranks" in out
    assert "a configuration error (exit code 2) is not restarted" in out, out[-3000:]
    metrics = run.run_dir / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text() == ""  # no step ran
