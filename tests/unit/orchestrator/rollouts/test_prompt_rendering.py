"""Prompts from problems: `[orchestrator.chat]` template auto/on/off with the byte tokenizer
and a Qwen3-style folder, the system prompt, template kwargs, stop ids, and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.common.errors import ConfigError
from tidal.orchestrator.config import ChatConfig, OrchestratorRunConfig
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.startup import build_prompt_renderer
from tidal.orchestrator.tasks import Problem
from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer

from ....hf_folders import build_model_folder

PROBLEM = Problem("abc>", "cba")
CHAT_PROBLEM = Problem(
    "system: Answer in French.\nuser: Hi",
    "Salut",
    messages=(
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hi"},
    ),
)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_folder(tmp_path_factory.mktemp("qwen3") / "model", "qwen3", weights=False)


def rendered(prompts: PromptRenderer, problem: Problem = PROBLEM) -> str:
    return prompts.tokenizer.decode(prompts.prompt_ids(problem), skip_special=False)


def test_byte_default_keeps_plain_prompts() -> None:
    prompts = PromptRenderer.from_config(ByteTokenizer(), ChatConfig())
    assert not prompts.template
    assert prompts.prompt_ids(PROBLEM) == [256, *b"abc>"]  # BOS + bytes, as before
    sample = prompts.reference_sample(PROBLEM)
    assert sample.completion_ids == (*b"cba", 257) and sample.completion_mask == ()


def test_byte_tokenizer_with_template_on_uses_its_built_in_template() -> None:
    prompts = PromptRenderer.from_config(ByteTokenizer(), ChatConfig(template="on"))
    assert rendered(prompts) == "<bos><|user|>\nabc><eos><|assistant|>\n"


def test_a_folder_tokenizer_renders_prompts_with_its_template_by_default(qwen3: Path) -> None:
    prompts = PromptRenderer.from_config(HFTokenizer.from_folder(qwen3), ChatConfig())
    assert prompts.template
    assert rendered(prompts) == "<|im_start|>user\nabc><|im_end|>\n<|im_start|>assistant\n"


def test_template_off_encodes_the_prompt_text_of_a_folder_tokenizer(qwen3: Path) -> None:
    tok = HFTokenizer.from_folder(qwen3)
    prompts = PromptRenderer.from_config(tok, ChatConfig(template="off"))
    assert prompts.prompt_ids(PROBLEM) == tok.encode("abc>")


def test_problem_messages_are_rendered_instead_of_their_plain_text(qwen3: Path) -> None:
    prompts = PromptRenderer.from_config(HFTokenizer.from_folder(qwen3), ChatConfig())
    assert rendered(prompts, CHAT_PROBLEM) == (
        "<|im_start|>system\nAnswer in French.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_system_prompt_opens_chats_that_have_no_system_message(qwen3: Path) -> None:
    chat = ChatConfig(system_prompt="Think briefly.")
    prompts = PromptRenderer.from_config(HFTokenizer.from_folder(qwen3), chat)
    assert rendered(prompts).startswith("<|im_start|>system\nThink briefly.<|im_end|>\n")
    assert "Think briefly." not in rendered(prompts, CHAT_PROBLEM)  # its own system wins


def test_template_kwargs_reach_the_template(qwen3: Path) -> None:
    chat = ChatConfig(template_kwargs={"enable_thinking": False})
    prompts = PromptRenderer.from_config(HFTokenizer.from_folder(qwen3), chat)
    assert rendered(prompts).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_stop_ids_are_every_end_of_generation_id(qwen3: Path) -> None:
    tok = HFTokenizer.from_folder(qwen3)
    prompts = PromptRenderer.from_config(tok, ChatConfig())
    end_of_turn, end_of_text = tok.encode_template_text("<|im_end|><|endoftext|>")
    assert prompts.stop_ids == [end_of_turn, end_of_text]
    assert PromptRenderer.from_config(ByteTokenizer(), ChatConfig()).stop_ids == [257]


def test_template_on_without_a_template_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    folder = build_model_folder(tmp_path / "model", "qwen3", weights=False)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    del config["chat_template"]
    config_file.write_text(json.dumps(config))
    tok = HFTokenizer.from_folder(folder)
    with pytest.raises(ConfigError, match=r'orchestrator\.chat\.template = "on" but tokenizer'):
        PromptRenderer.from_config(tok, ChatConfig(template="on"))
    assert not PromptRenderer.from_config(tok, ChatConfig()).template  # auto: plain text


@pytest.mark.parametrize(
    ("chat", "key"),
    [
        (ChatConfig(system_prompt="Be brief."), "orchestrator.chat.system_prompt"),
        (
            ChatConfig(template_kwargs={"enable_thinking": False}),
            "orchestrator.chat.template_kwargs",
        ),
    ],
)
def test_template_only_keys_with_plain_prompts_are_config_errors(
    chat: ChatConfig, key: str
) -> None:
    with pytest.raises(ConfigError, match=f"{key} is set but prompts are plain text"):
        PromptRenderer.from_config(ByteTokenizer(), chat)


def test_the_service_loads_the_tokenizer_of_the_model_folder(qwen3: Path) -> None:
    config = OrchestratorRunConfig.model_validate(
        {
            "trainer": {"model": {"path": str(qwen3)}},
            "orchestrator": {"chat": {"template_kwargs": {"enable_thinking": False}}},
        }
    )
    prompts = build_prompt_renderer(config)
    assert prompts.tokenizer.name == HFTokenizer.from_folder(qwen3).name
    assert rendered(prompts).endswith("<think>\n\n</think>\n\n")
