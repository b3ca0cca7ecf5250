"""Services of a run must tokenize alike: what each reports, and the orchestrator's check."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.rpc.v1 import common_pb2
from tidal.text.agreement import TokenizerMismatch, check_agreement, tokenizer_info
from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer


def test_the_same_tokenizer_agrees_even_from_another_path(qwen3_folder: Path) -> None:
    tok = HFTokenizer.from_folder(qwen3_folder)
    reported = tokenizer_info(tok)
    assert (reported.vocab_size, tuple(reported.eos_ids)) == (tok.vocab_size, tok.eos_ids)
    reported.name = "/mnt/elsewhere/qwen3"  # the same folder copied to another machine
    check_agreement(tok, reported, peer="inference at 10.0.0.2:50052")


def test_another_vocabulary_is_refused_naming_both_sizes_and_the_fix(qwen3_folder: Path) -> None:
    tok = HFTokenizer.from_folder(qwen3_folder)
    with pytest.raises(TokenizerMismatch) as refused:
        check_agreement(ByteTokenizer(), tokenizer_info(tok), peer="inference at h:1")
    message = str(refused.value)
    assert f"inference at h:1 tokenizes with {str(qwen3_folder)!r}" in message
    assert f"{tok.vocab_size} ids against this service's 259" in message
    assert "same run.tokenizer" in message


def test_other_eos_ids_are_refused() -> None:
    reported = tokenizer_info(ByteTokenizer())
    reported.eos_ids[:] = [258]
    with pytest.raises(TokenizerMismatch, match=r"EOS ids \[258\] against \[257\]"):
        check_agreement(ByteTokenizer(), reported, peer="the trainer at h:2")


def test_a_peer_reporting_nothing_is_not_refused() -> None:
    check_agreement(ByteTokenizer(), common_pb2.TokenizerInfo(), peer="an older trainer")
