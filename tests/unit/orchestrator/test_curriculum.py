"""The curriculum: pass rates per problem and task, skipping, re-admission, learning-progress
and signal weights, and a state that resumes the exact draw sequence."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from tidal.orchestrator.curriculum_config import CurriculumConfig
from tidal.orchestrator.mixture import MIXTURE_SEED_KEY, TaskMixture
from tidal.orchestrator.seeds import derive_seed
from tidal.orchestrator.task_config import DatasetTaskConfig, ReversalTaskConfig
from tidal.orchestrator.tasks import build_tasks
from tidal.orchestrator.tasks.base import Problem


def _dataset(tmp_path: Path, records: int = 10) -> DatasetTaskConfig:
    path = tmp_path / "qa.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"{i}>", "answer": str(i)}) + "\n" for i in range(records))
    )
    return DatasetTaskConfig(path=path, name="qa", eval_fraction=0.0)


def _mixture(tmp_path: Path, curriculum: CurriculumConfig, *, seed: int = 0) -> TaskMixture:
    configs = [_dataset(tmp_path), ReversalTaskConfig()]
    return TaskMixture(
        build_tasks(configs, seed=seed), [1.0, 1.0], seed=seed, curriculum=curriculum
    )


def _solved(problem: Problem) -> list[float]:
    """A fixed verdict per problem: even records always solved, odd ones never."""
    if problem.task != "qa":
        return [0.25, 0.5, 0.5, 0.75]  # its groups disagree: signal, at a steady mean
    return [float(int(problem.answer) % 2 == 0)] * 4


def _run(mixture: TaskMixture, steps: range, per_step: int = 4) -> list[list[str]]:
    """Draw and observe `per_step` problems a step; the uids drawn per step."""
    drawn = []
    for step in steps:
        problems = mixture.draw(per_step, step=step)
        for problem in problems:
            mixture.observe(problem, _solved(problem))
        drawn.append([p.uid for p in problems])
    return drawn


def _admits(mixture: TaskMixture, problem: Problem, step: int) -> bool:
    return mixture.curriculum.admits(problem.task, problem.key or problem.uid, step)


SKIP_BOTH = CurriculumConfig(skip_above=1.0, skip_below=0.0, min_samples=4, readmit_after=30)


def test_problems_always_or_never_solved_are_skipped_once_seen(tmp_path: Path) -> None:
    mixture = _mixture(tmp_path, SKIP_BOTH)
    drawn = [uid for step in _run(mixture, range(1, 11)) for uid in step]
    qa = [uid for uid in drawn if uid.startswith("qa/")]
    lines = Counter(uid.rsplit("/", 1)[1] for uid in qa)
    # each of the 10 records is seen once, then skipped: no record comes back
    assert set(lines.values()) == {1}
    assert len(lines) == 10
    assert mixture.curriculum.skips > 0
    assert mixture.curriculum_metrics()["curriculum/skipped_now"] == 10


def test_a_problem_in_the_band_is_never_skipped(tmp_path: Path) -> None:
    mixture = _mixture(tmp_path, CurriculumConfig(skip_above=1.0, min_samples=4))
    problem = mixture.tasks["qa"].problem(0)
    mixture.observe(problem, [1.0, 0.0, 1.0, 1.0])
    assert _admits(mixture, problem, 1)
    mixture.observe(problem, [1.0, 1.0, 0.0, 1.0])
    assert _admits(mixture, problem, 2)


def test_a_problem_is_tracked_across_epochs_by_its_record(tmp_path: Path) -> None:
    mixture = _mixture(tmp_path, SKIP_BOTH)
    task = mixture.tasks["qa"]
    size = task.size("train")
    first = task.problem(0)
    (next_epoch,) = [
        p for p in map(task.problem, range(size, 2 * size)) if p.prompt == first.prompt
    ]  # each epoch is shuffled anew
    assert first.uid != next_epoch.uid and first.key == next_epoch.key
    mixture.observe(first, [1.0] * 4)
    assert not _admits(mixture, next_epoch, 3)


def test_a_skipped_problem_is_readmitted_after_readmit_after_steps(tmp_path: Path) -> None:
    config = CurriculumConfig(skip_above=1.0, min_samples=4, readmit_after=5)
    mixture = _mixture(tmp_path, config)
    problem = mixture.tasks["qa"].problem(0)
    mixture.observe(problem, [1.0] * 4)
    assert not _admits(mixture, problem, 10)
    assert not _admits(mixture, problem, 14)
    assert _admits(mixture, problem, 15)
    # its record was cleared: the problem is tracked afresh from its next completions
    assert _admits(mixture, problem, 16)
    assert mixture.curriculum.skips == 2


def test_an_unbounded_task_is_tracked_per_task_only(tmp_path: Path) -> None:
    mixture = _mixture(tmp_path, SKIP_BOTH)
    _run(mixture, range(1, 6))
    assert not any(key.startswith("reversal/") for key in mixture.curriculum.problems)
    assert mixture.curriculum.tasks["reversal"].samples > 0


def test_learning_progress_weights_the_task_whose_reward_moves(tmp_path: Path) -> None:
    config = CurriculumConfig(task_weighting="learning_progress", explore=0.2)
    mixture = _mixture(tmp_path, config)
    assert mixture.curriculum.task_weights(mixture.names, mixture.weights) == [1.0, 1.0]
    qa, reversal = mixture.tasks["qa"].problem(0), mixture.tasks["reversal"].problem(0)
    for i in range(10):  # qa's reward climbs; reversal's stays where it is
        mixture.observe(qa, [float(j < i) for j in range(10)])
        mixture.observe(reversal, [1.0] * 10)
    qa_weight, reversal_weight = mixture.curriculum.task_weights(mixture.names, mixture.weights)
    assert reversal_weight == pytest.approx(0.2 * 0.5)  # only its explore share
    assert qa_weight == pytest.approx(0.8 + 0.2 * 0.5)
    counts = Counter(p.task for p in mixture.draw(2000, step=11))
    assert counts["qa"] / 2000 == pytest.approx(0.9, abs=0.03)


def test_signal_weights_the_task_whose_groups_disagree(tmp_path: Path) -> None:
    config = CurriculumConfig(task_weighting="signal", explore=0.2)
    mixture = _mixture(tmp_path, config)
    curriculum = mixture.curriculum
    assert curriculum.task_weights(mixture.names, mixture.weights) == pytest.approx([0.5, 0.5])
    qa, reversal = mixture.tasks["qa"].problem(0), mixture.tasks["reversal"].problem(0)
    mixture.observe(qa, [0.0, 1.0, 1.0, 0.0])  # rewards differ: advantages to learn from
    mixture.observe(reversal, [1.0] * 4)  # all solved: every advantage zero
    qa_weight, reversal_weight = curriculum.task_weights(mixture.names, mixture.weights)
    assert reversal_weight == pytest.approx(0.2 * 0.5)  # only its explore share
    assert qa_weight == pytest.approx(0.8 + 0.2 * 0.5)
    for _ in range(10):  # reversal's groups start to disagree, qa's stop
        mixture.observe(qa, [1.0] * 4)
        mixture.observe(reversal, [0.25, 0.5, 0.5, 1.0])
    signal = 1 - 0.9**10  # the EMA at fast_rate 0.1 after ten groups, from 1 (qa) and 0
    assert curriculum.tasks["qa"].signal == pytest.approx(1 - signal)
    assert curriculum.tasks["reversal"].signal == pytest.approx(signal)
    qa_weight, reversal_weight = curriculum.task_weights(mixture.names, mixture.weights)
    assert reversal_weight == pytest.approx(0.8 * signal + 0.1)
    metrics = mixture.curriculum_metrics()
    assert metrics["curriculum/reversal/signal"] == pytest.approx(signal)
    assert metrics["curriculum/reversal/weight"] == pytest.approx(reversal_weight)


def test_signal_weights_fall_back_to_the_fixed_mixture_when_no_group_disagrees(
    tmp_path: Path,
) -> None:
    mixture = _mixture(tmp_path, CurriculumConfig(task_weighting="signal"))
    mixture.observe(mixture.tasks["qa"].problem(0), [0.0] * 4)
    mixture.observe(mixture.tasks["reversal"].problem(0), [1.0] * 4)
    assert mixture.curriculum.task_weights(mixture.names, mixture.weights) == [1.0, 1.0]


@pytest.mark.parametrize("weighting", ["learning_progress", "signal"])
def test_the_saved_state_draws_what_the_uninterrupted_run_draws(
    tmp_path: Path, weighting: str
) -> None:
    config = SKIP_BOTH.model_copy(update={"task_weighting": weighting})
    uninterrupted = _mixture(tmp_path, config, seed=3)
    expected = _run(uninterrupted, range(1, 21))

    interrupted = _mixture(tmp_path, config, seed=3)
    first = _run(interrupted, range(1, 9))
    saved = json.loads(json.dumps(interrupted.state_dict()))  # as progress.json holds it
    resumed = _mixture(tmp_path, config, seed=3)  # a new process
    resumed.load_state_dict(saved)
    assert first + _run(resumed, range(9, 21)) == expected
    assert resumed.state_dict() == uninterrupted.state_dict()


def test_a_state_saved_without_a_curriculum_loads_with_a_fresh_one(tmp_path: Path) -> None:
    mixture = _mixture(tmp_path, SKIP_BOTH)
    state = mixture.state_dict()
    del state["curriculum"]
    mixture.load_state_dict(state)
    assert mixture.curriculum.problems == {}


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"skip_above": 0.5, "skip_below": 0.5}, ("skip_below", "skip_above")),
        (
            {"task_weighting": "learning_progress", "fast_rate": 0.1, "slow_rate": 0.2},
            ("slow_rate", "fast_rate"),
        ),
    ],
)
def test_contradictory_settings_are_refused_naming_both_keys(
    fields: dict[str, object], names: tuple[str, str]
) -> None:
    with pytest.raises(ValidationError) as error:
        CurriculumConfig(**fields)  # type: ignore[arg-type]
    for name in names:
        assert f"orchestrator.curriculum.{name}" in str(error.value)


def test_a_skipped_problems_place_goes_to_the_task_the_weights_pick(tmp_path: Path) -> None:
    mixture = _mixture(tmp_path, SKIP_BOTH)
    _run(mixture, range(1, 11))  # every qa record is seen, and every one is out of band
    later = Counter(p.task for p in mixture.draw(100, step=12))
    assert later == {"reversal": 100}


def test_without_skips_the_draws_are_a_plain_weighted_choice(tmp_path: Path) -> None:
    mixture = _mixture(tmp_path, CurriculumConfig(), seed=4)
    tasks = [p.task for p in mixture.draw(200, step=1)]
    plain = random.Random(derive_seed(4, MIXTURE_SEED_KEY)).choices(["qa", "reversal"], k=200)
    assert tasks == plain


def test_a_problem_is_judged_on_its_latest_visit_not_its_history(tmp_path: Path) -> None:
    mixture = _mixture(tmp_path, CurriculumConfig(skip_above=1.0, min_samples=4))
    problem = mixture.tasks["qa"].problem(0)
    mixture.observe(problem, [0.0] * 4)  # failed at first
    assert _admits(mixture, problem, 1)
    mixture.observe(problem, [1.0] * 4)  # solved every time since
    assert not _admits(mixture, problem, 2)


def test_a_generated_task_with_a_train_size_repeats_its_problems_and_is_tracked() -> None:
    (task,) = build_tasks([ReversalTaskConfig(train_size=3, max_len=6)], seed=0)
    first, again = task.problem(1), task.problem(4)
    assert (first.prompt, first.key) == (again.prompt, again.key) and first.uid != again.uid
    assert task.size("train") == 3 and task.size("eval") is None
    mixture = TaskMixture([task], [1.0], seed=0, curriculum=SKIP_BOTH)
    mixture.observe(first, [1.0] * 4)
    assert not _admits(mixture, again, 1)


def test_a_task_whose_every_problem_is_skipped_is_searched_once_until_one_is_due(
    tmp_path: Path,
) -> None:
    mixture = TaskMixture(
        build_tasks([_dataset(tmp_path)], seed=0), [1.0], seed=0, curriculum=SKIP_BOTH
    )
    _run(mixture, range(1, 4))  # all 10 records seen: every one is out of band
    first = mixture.draw(4, step=4)  # searches the 10 records (across an epoch's edge)
    skips = mixture.curriculum.skips
    drawn = [mixture.draw(4, step=step) for step in range(5, 30)]
    # the search found nothing to admit: the draws that follow take what the weights pick
    # without searching again, until the first skip is due back
    assert mixture.curriculum.skips == skips
    assert all(len(step) == 4 for step in [first, *drawn])
    due = mixture.curriculum.blocked["qa"]
    assert due == min(r.skipped_at for r in mixture.curriculum.problems.values()) + 30
    (readmitted, *_) = mixture.draw(4, step=due)
    assert readmitted.key not in mixture.curriculum.problems  # its record cleared: judged anew
