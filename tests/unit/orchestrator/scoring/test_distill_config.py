"""`[orchestrator.distill]`: what composes with distillation and what is refused by name,
the teacher's per-token terms, and a teacher folder that tokenizes otherwise than the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tidal.common.errors import ConfigError
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.scoring.teacher import check_shared_tokenizer, subtract_mean, token_terms
from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer

from ....hf_folders import qwen3_folder

__all__ = ["qwen3_folder"]


def config(**fields: Any) -> OrchestratorConfig:
    return OrchestratorConfig.model_validate(fields)


def test_distillation_is_off_by_default_and_on_with_any_teacher() -> None:
    assert not config().distill.enabled
    assert config(distill={"address": "127.0.0.1:1"}).distill.enabled
    assert config(distill={"self_distill": True}).distill.enabled


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"sampling": {"temperature": 0.7}}, "orchestrator.sampling.temperature"),
        ({"sampling": {"top_p": 0.9}}, "top_p"),
        ({"advantages": {"dynamic_sampling": True}}, "orchestrator.advantages.dynamic_sampling"),
        ({"distill": {"self_distill": True, "address": "h:1"}}, "orchestrator.distill.address"),
    ],
)
def test_settings_distillation_cannot_use_are_refused_by_name(
    fields: dict[str, Any], named: str
) -> None:
    distill = {"address": "127.0.0.1:1", **fields.pop("distill", {})}
    with pytest.raises(ValidationError, match=named.replace(".", r"\.")):
        config(distill=distill, **fields)


def test_mixing_with_reward_keeps_dynamic_sampling() -> None:
    mixed = config(distill={"address": "h:1", "mode": "add"}, advantages={"dynamic_sampling": True})
    assert mixed.distill.mode == "add"


def test_a_token_term_is_coef_times_the_logprob_gap_and_zero_at_environment_tokens() -> None:
    c = Completion(0, (5, 6, 7), (-1.0, 0.0, -2.0), (0, 0), True, loss_mask=(1.0, 0.0, 1.0))
    terms, kl, tokens = token_terms(c, (-0.5, -9.0, -3.0), coef=2.0)
    assert terms == (1.0, 0.0, -2.0)
    assert (kl, tokens) == (-0.5 + 1.0, 2)


def test_a_teacher_that_tokenizes_otherwise_is_refused_naming_both_keys(qwen3_folder: Path) -> None:
    with pytest.raises(ConfigError) as info:
        check_shared_tokenizer(ByteTokenizer(), qwen3_folder)
    assert "orchestrator.distill.model_path" in str(info.value)
    assert "run.tokenizer" in str(info.value)
    check_shared_tokenizer(HFTokenizer.from_folder(qwen3_folder), qwen3_folder)  # the same: ok


def test_a_group_baseline_centres_the_model_tokens_terms() -> None:
    a = Completion(0, (5, 6), (-1.0, -1.0), (0, 0), True)
    b = Completion(1, (7, 8), (-1.0, 0.0), (0,), True, loss_mask=(1.0, 0.0))
    terms = [token_terms(a, (-2.0, 0.0), 1.0)[0], token_terms(b, (-4.0, -9.0), 1.0)[0]]
    assert terms == [(-1.0, 1.0), (-3.0, 0.0)]
    centred = subtract_mean(terms, [a, b], mean=-1.0)
    assert centred == [(0.0, 2.0), (-2.0, 0.0)]  # environment tokens stay 0
