"""The math verifier: GSM8K and MATH-style answers through math-verify, in verifier threads."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from tidal.orchestrator.scoring.verifier_pool import VerifierPool
from tidal.orchestrator.task_config import DatasetTaskConfig
from tidal.orchestrator.tasks import Verdict, build_task
from tidal.orchestrator.tasks.dataset import DatasetTask
from tidal.orchestrator.tasks.math_answers import MathVerifier

GSM8K_SOLUTION = (
    "Janet's ducks lay 16 eggs per day. She eats 3 and bakes 4, so she sells "
    "16 - 3 - 4 = <<16-3-4=9>>9 eggs.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18"
)
RIGHT = Verdict(1.0, {"format": 1.0, "answer": 1.0})
WRONG = Verdict(0.0, {"format": 1.0, "answer": 0.0})
MALFORMED = Verdict(0.0, {"format": 0.0, "answer": 0.0})


@pytest.fixture(scope="module")
def verifier() -> MathVerifier:
    return MathVerifier()


@pytest.fixture
def gsm8k(tmp_path: Path) -> DatasetTask:
    path = tmp_path / "gsm8k.jsonl"
    record = {"question": "How much does Janet make every day?", "answer": GSM8K_SOLUTION}
    path.write_text(json.dumps(record) + "\n")
    config = DatasetTaskConfig(path=path, prompt_field="question", verifier="math", eval_fraction=0)
    return DatasetTask(config)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("She sells 9 eggs for $2 each, so she makes 18 dollars.", RIGHT),  # last number
        ("9 * 2 = 18\n#### 18", RIGHT),  # GSM8K's own format
        ("The answer is \\boxed{18}.", RIGHT),
        ("I think it is \\boxed{18} and not 20", RIGHT),  # boxed beats the last number
        ("She makes 9 * 2 = 16 dollars.", WRONG),
        ("#### 17", WRONG),
        ("I do not know.", MALFORMED),
        ("", MALFORMED),
    ],
)
def test_gsm8k_jsonl_gives_the_known_rewards(
    gsm8k: DatasetTask, completion: str, expected: Verdict
) -> None:
    assert gsm8k.verify(gsm8k.problem(0), completion) == expected


def test_gsm8k_worked_solution_is_the_warm_start_reference(gsm8k: DatasetTask) -> None:
    problem = gsm8k.problem(0)
    assert problem.reference == GSM8K_SOLUTION
    assert gsm8k.verify(problem, problem.reference) == RIGHT


@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("0.5", "\\frac{1}{2}"),
        ("so $x = \\boxed{\\sqrt{8}}$", "2\\sqrt{2}"),
        ("\\boxed{1+x^2}", "x^2 + 1"),
        ("The total is 1,000.", "#### 1,000"),
        ("Final answer: \\boxed{\\dfrac{3}{4}}", "The answer is $\\boxed{0.75}$."),  # MATH solution
    ],
)
def test_math_answers_are_compared_symbolically(
    verifier: MathVerifier, completion: str, reference: str
) -> None:
    assert verifier.score(completion, reference) == RIGHT


def test_a_different_value_is_wrong_not_malformed(verifier: MathVerifier) -> None:
    assert verifier.score("\\boxed{\\sqrt{2}}", "2\\sqrt{2}") == WRONG


def test_an_unreadable_reference_is_an_error_not_a_silent_zero(verifier: MathVerifier) -> None:
    with pytest.raises(ValueError, match="has no answer math-verify can read"):
        verifier.score("#### 18", "#### ")


def test_format_weight_rewards_an_extractable_answer() -> None:
    weighted = MathVerifier(format_weight=0.2)
    assert weighted.score("#### 17", "18").reward == pytest.approx(0.2)
    assert weighted.score("#### 18", "18").reward == pytest.approx(1.0)
    assert weighted.score("no idea", "18").reward == 0.0


def test_format_weight_is_only_for_the_math_verifier(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="format_weight applies to verifier = 'math'"):
        DatasetTaskConfig(path=tmp_path / "x.jsonl", verifier="numeric", format_weight=0.1)


@pytest.mark.timeout(30)
def test_a_power_tower_is_refused_instead_of_evaluated(verifier: MathVerifier) -> None:
    # sympy would compute 9^(9^(9^9)) while holding the GIL, freezing every thread
    assert verifier.score("\\boxed{9^{9^{9^{9}}}}", "5") == WRONG
    assert verifier.score("\\boxed{100000!}", "5") == WRONG
    assert verifier.score("\\boxed{\\binom{10^{9}}{10^{8}}}", "5") == WRONG
    assert verifier.score("\\boxed{\\Gamma(10^{7})}", "5") == WRONG


def test_scores_in_a_worker_thread_without_math_verify_signal_errors(
    verifier: MathVerifier,
) -> None:
    results: list[Verdict] = []
    worker = threading.Thread(target=lambda: results.append(verifier.score("\\boxed{18}", "18")))
    worker.start()
    worker.join(timeout=30)
    assert results == [RIGHT]


def test_verifier_pool_scores_math_with_sub_scores(gsm8k: DatasetTask) -> None:
    task = build_task(gsm8k.config, seed=0)
    verifiers = VerifierPool({task.name: task}, timeout_s=30)
    try:
        outcomes = asyncio.run(verifiers.score(task.problem(0), ["#### 18", "what?"]))
    finally:
        verifiers.close()
    assert [(o.reward, o.scores, o.failure) for o in outcomes] == [
        (1.0, {"format": 1.0, "answer": 1.0}, None),
        (0.0, {"format": 0.0, "answer": 0.0}, None),
    ]
