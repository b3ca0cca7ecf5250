"""A judge's prompt is its rubric filled in once; its reply becomes a reward in [0, 1] or
None (unparsable), by the last score it gives."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tidal.orchestrator.scoring.model_reward_config import JudgeRewardConfig
from tidal.orchestrator.scoring.rubric import parse_score, render_rubric

URL = "http://127.0.0.1:1/v1"


def judge(**settings: object) -> JudgeRewardConfig:
    return JudgeRewardConfig(base_url=URL, **settings)  # type: ignore[arg-type]


def test_rendering_fills_every_placeholder_and_keeps_other_braces() -> None:
    rubric = 'Q: {prompt}\nA: {completion}\nRef: {reference} / {answer}\nReply {"score": n}'
    text = render_rubric(rubric, prompt="2+2", completion="4", reference="4.0", answer="4")
    assert text == 'Q: 2+2\nA: 4\nRef: 4.0 / 4\nReply {"score": n}'


def test_a_completion_holding_a_placeholder_is_sent_as_written() -> None:
    text = render_rubric("{completion} vs {reference}", completion="{reference}", reference="R")
    assert text == "{reference} vs R"


@pytest.mark.parametrize(
    ("reply", "reward"),
    [
        ("7", 0.7),
        ("I think 3, no: 10", 1.0),
        ("<think>maybe 2</think>Score: 5", 0.5),
        ("0", 0.0),
        ("2.5 out of 10", 1.0),  # the last number counts: "10"
        ("no number here", None),
        ("11", None),  # outside [min_score, max_score]
        ("-1", None),
        ("<think>8", None),  # an unfinished thought holds no answer
    ],
)
def test_number_scores_map_the_last_number_linearly(reply: str, reward: float | None) -> None:
    expected = None if reward is None else pytest.approx(reward)
    assert parse_score(reply, judge()) == expected


def test_a_pattern_picks_the_number_it_groups() -> None:
    config = judge(pattern=r"Score:\s*(\d+)", min_score=1, max_score=5)
    assert parse_score("criteria 1-5. Score: 4. Thanks 2", config) == pytest.approx(0.75)
    assert parse_score("I give it 4", config) is None


def test_verdicts_are_whole_words_in_any_case_and_the_last_one_counts() -> None:
    config = judge(score="verdict")
    assert parse_score("This is INCORRECT.", config) == 0.0
    assert parse_score("Looks incorrect at first, but it is correct", config) == 1.0
    assert parse_score("incorrectly formatted", config) is None
    assert parse_score("<think>correct?</think> Incorrect", config) == 0.0


def test_a_judge_needs_an_endpoint_and_a_rubric_that_shows_the_completion() -> None:
    with pytest.raises(ValidationError, match="model_path"):
        JudgeRewardConfig()
    with pytest.raises(ValidationError, match="completion"):
        judge(rubric="Grade {prompt}")
    with pytest.raises(ValidationError, match="one group"):
        judge(pattern=r"\d+")
    with pytest.raises(ValidationError, match="verdicts"):
        judge(verdicts={"yes": 2.0})
