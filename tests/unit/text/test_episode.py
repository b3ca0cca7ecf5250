"""Multi-turn episodes: the policy's ids verbatim under loss mask 1, environment turns from
the chat template under mask 0, and ids already sent never changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.text.byte import ByteTokenizer
from tidal.text.episode import Episode, end_of_turn
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.tokenizer import Tokenizer

OPENING = [{"role": "user", "content": "What is 12 + 30? Café 😀"}]


@pytest.fixture(params=["byte", "qwen3", "llama"])
def tokenizer(request: pytest.FixtureRequest, folders: dict[str, Path]) -> Tokenizer:
    if request.param == "byte":
        return ByteTokenizer()
    return HFTokenizer.from_folder(folders[request.param])


def turn_end(tokenizer: Tokenizer) -> int:
    found = end_of_turn(tokenizer)
    assert found is not None
    return found[1]


def generated(tokenizer: Tokenizer, text: str, *, closed: bool = True) -> list[int]:
    """What a policy would emit for `text`: its ids, then the end-of-turn token."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [*ids, turn_end(tokenizer)] if closed else ids


def two_turns(tokenizer: Tokenizer) -> tuple[Episode, list[list[int]]]:
    episode = Episode(tokenizer, system_prompt="Be brief.")
    episode.start(OPENING)
    answers = [generated(tokenizer, "It is 42."), generated(tokenizer, "Tokyo, 東京 🗼")]
    episode.add_assistant(answers[0])
    episode.add_messages([{"role": "user", "content": "And the capital of Japan?"}])
    episode.add_assistant(answers[1])
    return episode, answers


def test_only_the_policys_ids_are_trained_and_they_are_verbatim(tokenizer: Tokenizer) -> None:
    episode, answers = two_turns(tokenizer)
    assert len(episode.ids) == len(episode.loss_mask)
    trained = [i for i, m in zip(episode.ids, episode.loss_mask, strict=True) if m]
    assert trained == answers[0] + answers[1]
    first = episode.loss_mask.index(1)
    assert episode.ids[first : first + len(answers[0])] == answers[0]


def test_episode_is_the_templates_rendering_of_its_messages(tokenizer: Tokenizer) -> None:
    episode, _ = two_turns(tokenizer)
    full = tokenizer.apply_chat_template(
        episode.messages, add_generation_prompt=False, system_prompt="Be brief."
    )
    assert full.startswith(tokenizer.decode(episode.ids, skip_special=False))


def test_decode_then_reencode_gives_the_same_ids(tokenizer: Tokenizer) -> None:
    episode, _ = two_turns(tokenizer)
    text = tokenizer.decode(episode.ids, skip_special=False)
    assert tokenizer.encode_template_text(text) == episode.ids


def test_environment_turn_ids_are_what_the_policy_is_sent_next(tokenizer: Tokenizer) -> None:
    episode = Episode(tokenizer)
    prompt = episode.start(OPENING)
    episode.add_assistant(generated(tokenizer, "It is 42."))
    sent = episode.add_messages([{"role": "user", "content": "Sure?"}])
    assert episode.ids[: len(prompt)] == prompt and episode.ids[-len(sent) :] == sent
    assert episode.loss_mask[-len(sent) :] == [0] * len(sent)
    expected = tokenizer.apply_chat_template(episode.messages, add_generation_prompt=True)
    assert tokenizer.decode(episode.ids, skip_special=False) == expected


def test_an_unusual_tokenization_by_the_policy_is_kept(folders: dict[str, Path]) -> None:
    tok = HFTokenizer.from_folder(folders["qwen3"])
    by_char = [i for ch in " world" for i in tok.encode(ch, add_special_tokens=False)]
    assert len(tok.encode(" world", add_special_tokens=False)) < len(by_char)  # merges exist
    episode = Episode(tok)
    episode.start(OPENING)
    episode.add_assistant([*by_char, turn_end(tok)])
    episode.add_messages([{"role": "user", "content": "again"}])
    assert [i for i, m in zip(episode.ids, episode.loss_mask, strict=True) if m][:-1] == by_char
    # Re-tokenizing the text would have changed what the policy saw:
    text = tok.decode(episode.ids, skip_special=False)
    assert tok.encode_template_text(text) != episode.ids


def test_a_generation_cut_before_its_end_of_turn_is_closed_by_the_template(
    tokenizer: Tokenizer,
) -> None:
    episode = Episode(tokenizer)
    episode.start(OPENING)
    cut = generated(tokenizer, "It is", closed=False)
    episode.add_assistant(cut)
    sent = episode.add_messages([{"role": "user", "content": "Go on."}])
    assert sent[0] == turn_end(tokenizer)  # the closing is environment text, mask 0
    assert episode.loss_mask.count(1) == len(cut)


def test_earlier_thinking_is_kept_when_the_template_would_drop_it(
    folders: dict[str, Path],
) -> None:
    tok = HFTokenizer.from_folder(folders["qwen3"])
    episode = Episode(tok, template_kwargs={"enable_thinking": True})
    episode.start(OPENING)
    answer = generated(tok, "<think>\nadd them\n</think>\n\nIt is 42.")
    episode.add_assistant(answer)
    before = list(episode.ids)
    follow_up = {"role": "user", "content": "And 東京?"}
    # From scratch, the template drops the first answer's thinking...
    scratch = tok.apply_chat_template([*episode.messages, follow_up], add_generation_prompt=True)
    assert "add them" not in scratch
    sent = episode.add_messages([follow_up])
    # ...but the episode keeps every id the policy saw and appends only the new turn.
    assert episode.ids[: len(before)] == before and "add them" in tok.decode(episode.ids)
    assert tok.decode(sent, skip_special=False) == (
        "\n<|im_start|>user\nAnd 東京?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.decode(episode.ids, skip_special=False).endswith(scratch[-60:])


def test_thinking_and_a_cut_generation_together(folders: dict[str, Path]) -> None:
    tok = HFTokenizer.from_folder(folders["qwen3"])
    episode = Episode(tok)
    episode.start(OPENING)
    episode.add_assistant(generated(tok, "<think>\nadd\n</think>\n\nIt is", closed=False))
    sent = episode.add_messages([{"role": "user", "content": "More?"}])
    assert tok.decode(sent, skip_special=False) == (
        "<|im_end|>\n<|im_start|>user\nMore?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_results_and_template_kwargs_reach_the_template(folders: dict[str, Path]) -> None:
    tok = HFTokenizer.from_folder(folders["qwen3"])
    episode = Episode(tok, template_kwargs={"enable_thinking": False})
    prompt = episode.start(OPENING)
    assert tok.decode(prompt, skip_special=False).endswith("<think>\n\n</think>\n\n")
    episode.add_assistant(generated(tok, "calling the calculator tool now."))
    sent = episode.add_messages([{"role": "tool", "content": "42"}])
    assert "<tool_response>\n42\n</tool_response>" in tok.decode(sent, skip_special=False)
