"""Do the services of a run tokenize alike? What each reports, and the check.

Decisions:
- Every service resolves `run.tokenizer` itself (with `trainer.model.path`), so a run
  whose services were deployed with different configs can end up with two tokenizers:
  prompts encoded by one, completions decoded and trained by another, with no error
  anywhere, just garbage. Inference and the trainer therefore report theirs in GetStatus
  (`TokenizerInfo`) and the orchestrator, which encodes prompts, compares its own with
  both before the first step.
- Compared: the vocabulary size and the EOS ids, which decide whether ids mean the same
  and where generation stops. Not the name: the same folder may sit at different paths
  on different machines.
- A peer that reports no tokenizer (vocab_size 0, an older build) is logged and skipped,
  not refused.
"""

from __future__ import annotations

import logging

from tidal.common.errors import ConfigError
from tidal.rpc.v1 import common_pb2
from tidal.text.protocol import Tokenizer

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
