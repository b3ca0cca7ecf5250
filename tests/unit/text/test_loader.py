"""Choosing a tokenizer from config, reading a folder's tokenizer files, and the errors
that say which file is at fault and what to do."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tidal.common.config.shared import ServiceRunConfig
from tidal.common.errors import ConfigError
from tidal.text.byte import ByteTokenizer
from tidal.text.chat_template import ChatTemplateError
from tidal.text.hf_folder import TokenizerFolderError
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.loader import VocabMismatch, check_vocab, load_tokenizer
from tidal.text.tokenizer import Tokenizer

CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture
def qwen_copy(qwen3_folder: Path, tmp_path: Path) -> Path:
    """A copy of the Qwen3-style folder that a test may edit (weights left out)."""
    folder = tmp_path / "qwen"
    shutil.copytree(qwen3_folder, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    return folder


def edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del data[key]
    path.write_text(json.dumps(data))


def test_byte_spec_is_the_byte_tokenizer() -> None:
    tokenizer = load_tokenizer("byte")
    assert isinstance(tokenizer, ByteTokenizer) and isinstance(tokenizer, Tokenizer)


def test_folder_spec_and_model_spec_load_the_same_tokenizer(qwen3_folder: Path) -> None:
    by_path = load_tokenizer(str(qwen3_folder))
    by_model = load_tokenizer("model", model_path=qwen3_folder)
    assert isinstance(by_path, HFTokenizer) and isinstance(by_path, Tokenizer)
    assert by_path.encode("Café 😀") == by_model.encode("Café 😀")
    assert by_path.name == str(qwen3_folder)


def test_auto_spec_follows_the_run_model_folder(qwen3_folder: Path) -> None:
    """The default `run.tokenizer = "auto"`: bytes without a folder, else the folder's."""
    assert isinstance(load_tokenizer("auto"), ByteTokenizer)
    config = ServiceRunConfig.model_validate({"trainer": {"model": {"path": str(qwen3_folder)}}})
    assert config.run.tokenizer == "auto" and config.model_folder() == qwen3_folder
    tokenizer = load_tokenizer(config.run.tokenizer, model_path=config.model_folder())
    assert isinstance(tokenizer, HFTokenizer) and tokenizer.name == str(qwen3_folder)


def test_model_spec_without_a_model_path_says_what_to_set() -> None:
    with pytest.raises(ConfigError, match='"model" needs a model folder'):
        load_tokenizer("model", model_path=None)


def test_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        TokenizerFolderError, match=re.escape(f"{tmp_path / 'nope'} does not exist")
    ):
        load_tokenizer(str(tmp_path / "nope"))


def test_missing_tokenizer_json_names_the_file_and_the_fix(qwen_copy: Path) -> None:
    (qwen_copy / "tokenizer.json").unlink()
    (qwen_copy / "vocab.json").write_text("{}")
    with pytest.raises(TokenizerFolderError) as err:
        load_tokenizer(str(qwen_copy))
    message = str(err.value)
    assert str(qwen_copy / "tokenizer.json") in message and "is missing" in message
    assert "vocab.json" in message and "save_pretrained" in message
    assert isinstance(err.value, ConfigError)


def test_unreadable_tokenizer_json_is_named(qwen_copy: Path) -> None:
    (qwen_copy / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(TokenizerFolderError, match=re.escape("tokenizer.json cannot be read")):
        load_tokenizer(str(qwen_copy))


def test_chat_template_that_does_not_compile_is_refused_at_load(qwen_copy: Path) -> None:
    edit_json(qwen_copy / "tokenizer_config.json", chat_template="{% for m in messages %}")
    with pytest.raises(
        ChatTemplateError, match=re.escape("tokenizer_config.json does not compile")
    ):
        load_tokenizer(str(qwen_copy))


def test_raise_exception_in_a_template_becomes_a_chat_template_error(qwen3_folder: Path) -> None:
    tokenizer = load_tokenizer(str(qwen3_folder))
    late_system = [*CHAT, {"role": "system", "content": "late"}]
    with pytest.raises(ChatTemplateError, match="system message must come first"):
        tokenizer.apply_chat_template(late_system, add_generation_prompt=True)


def test_folder_without_a_template_says_so_when_a_chat_is_rendered(qwen_copy: Path) -> None:
    edit_json(qwen_copy / "tokenizer_config.json", chat_template=None)
    tokenizer = load_tokenizer(str(qwen_copy))
    assert tokenizer.encode("hi") == load_tokenizer(str(qwen_copy)).encode("hi")
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)


def test_named_templates_use_default_and_tool_use_when_tools_are_given(qwen_copy: Path) -> None:
    named = [
        {"name": "default", "template": "D{{ messages[0].content }}"},
        {"name": "tool_use", "template": "T{{ tools[0].name }}"},
    ]
    edit_json(qwen_copy / "tokenizer_config.json", chat_template=named)
    tokenizer = load_tokenizer(str(qwen_copy))
    assert tokenizer.apply_chat_template(CHAT, add_generation_prompt=False) == "Dhi"
    tools = [{"name": "calc"}]
    assert tokenizer.apply_chat_template(CHAT, add_generation_prompt=False, tools=tools) == "Tcalc"


def test_chat_template_jinja_file_wins_over_the_config(qwen_copy: Path) -> None:
    (qwen_copy / "chat_template.jinja").write_text("J{{ messages | length }}{{ eos_token }}")
    tokenizer = load_tokenizer(str(qwen_copy))
    assert tokenizer.apply_chat_template(CHAT, add_generation_prompt=True) == "J1<|im_end|>"


def test_eos_ids_merge_tokenizer_generation_config_and_end_of_turn(
    folders: dict[str, Path],
) -> None:
    qwen = HFTokenizer.from_folder(folders["qwen3"])
    im_end, endoftext = qwen.token_to_id("<|im_end|>"), qwen.token_to_id("<|endoftext|>")
    assert qwen.eos_ids == (im_end, endoftext) and qwen.eos_id == im_end
    assert qwen.end_of_turn_token == "<|im_end|>"
    llama = HFTokenizer.from_folder(folders["llama"])
    end, eot = llama.token_to_id("<|end_of_text|>"), llama.token_to_id("<|eot_id|>")
    assert llama.eos_ids == (end, eot) and llama.end_of_turn_token == "<|eot_id|>"


def test_end_of_turn_joins_eos_ids_when_no_config_lists_it(qwen_copy: Path) -> None:
    edit_json(qwen_copy / "tokenizer_config.json", eos_token="<|endoftext|>")
    (qwen_copy / "generation_config.json").unlink()
    tokenizer = HFTokenizer.from_folder(qwen_copy)
    ids = (tokenizer.token_to_id("<|endoftext|>"), tokenizer.token_to_id("<|im_end|>"))
    assert tokenizer.eos_ids == ids


def test_generation_config_eos_may_be_a_single_int(qwen_copy: Path) -> None:
    edit_json(qwen_copy / "tokenizer_config.json", eos_token=None, chat_template=None)
    edit_json(qwen_copy / "generation_config.json", eos_token_id=7)
    assert HFTokenizer.from_folder(qwen_copy).eos_ids == (7,)


def test_a_folder_with_no_eos_anywhere_is_refused(qwen_copy: Path) -> None:
    edit_json(qwen_copy / "tokenizer_config.json", eos_token=None, chat_template=None)
    (qwen_copy / "generation_config.json").unlink()
    with pytest.raises(TokenizerFolderError, match="names no end-of-sequence token"):
        HFTokenizer.from_folder(qwen_copy)


def test_pad_falls_back_to_eos(folders: dict[str, Path]) -> None:
    qwen = HFTokenizer.from_folder(folders["qwen3"])
    assert qwen.pad_id == qwen.token_to_id("<|endoftext|>")  # named in tokenizer_config
    llama = HFTokenizer.from_folder(folders["llama"])
    assert llama.pad_id == llama.eos_id  # none named


def test_special_tokens_map_fills_what_the_config_leaves_unset(qwen_copy: Path) -> None:
    edit_json(qwen_copy / "tokenizer_config.json", pad_token=None)
    edit_json(qwen_copy / "special_tokens_map.json", pad_token={"content": "<think>"})
    tokenizer = HFTokenizer.from_folder(qwen_copy)
    assert tokenizer.pad_id == tokenizer.token_to_id("<think>")


def test_tokens_the_vocabulary_lacks_are_added_as_transformers_adds_them(qwen_copy: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = json.loads((qwen_copy / "tokenizer_config.json").read_text())
    size = len(config["added_tokens_decoder"]) + min(map(int, config["added_tokens_decoder"]))
    config["added_tokens_decoder"][str(size)] = {"content": "<|tool|>", "special": True}
    config["pad_token"] = "<|pad|>"  # named, but in no vocabulary: added after
    (qwen_copy / "tokenizer_config.json").write_text(json.dumps(config))
    reference = transformers.AutoTokenizer.from_pretrained(qwen_copy)
    ours = HFTokenizer.from_folder(qwen_copy)
    assert ours.token_to_id("<|tool|>") == size == reference.convert_tokens_to_ids("<|tool|>")
    assert ours.pad_id == size + 1 == reference.pad_token_id
    assert ours.vocab_size == len(reference)
    text = "call<|tool|>now<|pad|>"
    assert ours.encode(text) == reference.encode(text)
    assert ours.decode(ours.encode(text)) == reference.decode(
        reference.encode(text), skip_special_tokens=True
    )


def test_added_token_at_a_different_id_is_refused(qwen_copy: Path) -> None:
    config = json.loads((qwen_copy / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"]["3"] = {"content": "<|im_end|>", "special": True}
    (qwen_copy / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerFolderError, match=re.escape("'<|im_end|>' at id 3")):
        HFTokenizer.from_folder(qwen_copy)


@pytest.mark.parametrize("add_bos, add_eos", [(True, True), (False, False)])
def test_tokenizer_json_post_processor_wins_over_add_bos_flags_as_in_transformers(
    llama_folder: Path, tmp_path: Path, add_bos: bool, add_eos: bool
) -> None:
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "llama"
    shutil.copytree(llama_folder, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    edit_json(folder / "tokenizer_config.json", add_bos_token=add_bos, add_eos_token=add_eos)
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    ours = HFTokenizer.from_folder(folder)
    for text in ["Hello, world!", "東京 😀"]:
        assert ours.encode(text) == reference.encode(text)
        assert ours.encode(text)[0] == ours.bos_id and ours.encode(text)[-1] != ours.eos_id


@pytest.mark.parametrize("add_bos, add_eos", [(True, True), (True, False), (False, False)])
def test_add_bos_and_add_eos_flags_apply_without_a_post_processor(
    llama_folder: Path, tmp_path: Path, add_bos: bool, add_eos: bool
) -> None:
    folder = tmp_path / "llama"
    shutil.copytree(llama_folder, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    spec = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**spec, "post_processor": None}))
    edit_json(folder / "tokenizer_config.json", add_bos_token=add_bos, add_eos_token=add_eos)
    ours = HFTokenizer.from_folder(folder)
    plain = ours.encode("Hello, world!", add_special_tokens=False)
    expected = [*([ours.bos_id] if add_bos else []), *plain, *([ours.eos_id] if add_eos else [])]
    assert ours.encode("Hello, world!") == expected


def test_vocab_check_names_both_sizes(qwen3_folder: Path) -> None:
    tokenizer = load_tokenizer(str(qwen3_folder))
    check_vocab(tokenizer, tokenizer.vocab_size)  # equal fits
    check_vocab(tokenizer, tokenizer.vocab_size + 64)  # a padded embedding fits
    with pytest.raises(VocabMismatch) as err:
        check_vocab(tokenizer, 300)
    assert f"has {tokenizer.vocab_size} ids" in str(err.value)
    assert "only 300 rows" in str(err.value) and isinstance(err.value, ConfigError)


def test_loading_a_folder_checks_its_config_vocab_size(qwen_copy: Path) -> None:
    edit_json(qwen_copy / "config.json", vocab_size=100)
    with pytest.raises(VocabMismatch, match="only 100 rows"):
        load_tokenizer(str(qwen_copy))


def test_byte_tokenizer_fits_the_default_model_only_when_large_enough() -> None:
    check_vocab(ByteTokenizer(), 259)
    with pytest.raises(VocabMismatch, match="tokenizer byte has 259 ids"):
        check_vocab(ByteTokenizer(), 258)
