"""`tidal client generate` treats prompts as the run's orchestrator does: the run's
tokenizer, `orchestrator.chat`, and every end-of-generation id as a stop id."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.cli.client import run_prompts
from tidal.common.config.shared import ServiceRunConfig
from tidal.common.errors import ConfigError
from tidal.orchestrator.tasks import Problem

from ...hf_folders import build_model_folder


def test_a_run_from_a_model_folder_renders_its_template_and_stops_at_its_eos_ids(
    tmp_path: Path,
) -> None:
    folder = build_model_folder(tmp_path / "model", "qwen3", weights=False)
    config = ServiceRunConfig.model_validate(
        {
            "trainer": {"model": {"path": str(folder)}},
            "orchestrator": {"chat": {"system_prompt": "Be brief."}},
        }
    )
    prompts = run_prompts(config)
    assert prompts.stop_ids == list(prompts.tokenizer.eos_ids) and len(prompts.stop_ids) == 2
    text = prompts.tokenizer.decode(prompts.prompt_ids(Problem("Hi", "")), skip_special=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_byte_default_sends_plain_text_and_stops_at_eos() -> None:
    prompts = run_prompts(ServiceRunConfig())
    assert not prompts.template and prompts.stop_ids == [257]


def test_a_bad_chat_section_is_a_config_error() -> None:
    config = ServiceRunConfig.model_validate(
        {"orchestrator": {"chat": {"template_kwargs": {"a": 1}}}}
    )
    with pytest.raises(ConfigError, match=r"orchestrator\.chat\.template_kwargs is set"):
        run_prompts(config)
