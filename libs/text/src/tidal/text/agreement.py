"""Do the services of a run tokenize alike? What each reports, and the check.

Every service resolves `run.tokenizer` itself, so services deployed with different
configs could encode prompts with one vocabulary and train with another, silently.
Inference and the trainer report theirs in GetStatus and the orchestrator compares the
vocabulary size and EOS ids (not the name: one folder may sit at different paths)
before the first step. A peer that reports no tokenizer is logged, not refused.
"""

from __future__ import annotations

import logging

from tidal.common.errors import ConfigError
from tidal.rpc.v1 import common_pb2
from tidal.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class TokenizerMismatch(ConfigError):
    """Two services of one run tokenize differently."""


def tokenizer_info(tokenizer: Tokenizer) -> common_pb2.TokenizerInfo:
    """What a service reports of its tokenizer in GetStatus."""
    return common_pb2.TokenizerInfo(
        name=tokenizer.name, vocab_size=tokenizer.vocab_size, eos_ids=list(tokenizer.eos_ids)
    )


def check_agreement(mine: Tokenizer, theirs: common_pb2.TokenizerInfo, *, peer: str) -> None:
    """Raise `TokenizerMismatch` when `peer` (e.g. "inference at host:port") reports a
    tokenizer with another vocabulary size or other EOS ids than `mine`."""
    if theirs.vocab_size == 0:
        log.warning("%s reports no tokenizer; cannot check that it matches %s", peer, mine.name)
        return
    differences = []
    if theirs.vocab_size != mine.vocab_size:
        differences.append(f"{theirs.vocab_size} ids against this service's {mine.vocab_size}")
    if tuple(theirs.eos_ids) != tuple(mine.eos_ids):
        differences.append(f"EOS ids {list(theirs.eos_ids)} against {list(mine.eos_ids)}")
    if differences:
        raise TokenizerMismatch(
            f"run.tokenizer: {peer} tokenizes with {theirs.name!r} ({'; '.join(differences)}), "
            f"this service with {mine.name!r}; give every service the same run.tokenizer "
            "(and trainer.model.path) — e.g. the same config file"
        )
