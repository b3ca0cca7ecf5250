"""The step journal: entries round-trip exactly, replay stops at a gap, stale and
covered entries go, a torn or damaged entry is never replayed silently."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tidal.batch.packing import TrainSample, build_micro_batch
from tidal.batch.tensors import MicroBatchData, micro_batch_from_packed
from tidal.common.errors import DiskFull
from tidal.trainer.config import JOURNALED_INTERVAL, CheckpointConfig
from tidal.trainer.persistence.journal import StepJournal
from tidal.trainer.persistence.state_file import CorruptCheckpoint, state_file

SHA = bytes(range(32))


def shared_prompt_batch() -> MicroBatchData:
    """Two completions of one prompt packed after it once (`sample_parents` set)."""
    samples = [
        TrainSample((256, 1, 2), (3, 4), advantage=0.5, completion_logprobs=(-1.0, -2.0)),
        TrainSample((256, 1, 2), (5,), advantage=-0.5, completion_logprobs=(-0.5,)),
    ]
    return micro_batch_from_packed(build_micro_batch(samples, share_prompts=True))


def steps(journal: StepJournal) -> list[int]:
    return [step for step, _ in journal.entries()]


def test_an_entry_round_trips_every_field_exactly(
    tmp_path: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    journal = StepJournal(tmp_path)
    batches = [*step_batches(3), shared_prompt_batch()]
    journal.append(3, batches, "sft", SHA)
    (entry,) = list(journal.after(2))
    assert (entry.step, entry.kind, entry.payload_sha256) == (3, "sft", SHA)
    for sent, read in zip(batches, entry.batches, strict=True):
        assert read.rank == sent.rank
        for name in vars(sent).keys() - {"rank"}:
            sent_value, read_value = getattr(sent, name), getattr(read, name)
            if sent_value is None:  # an optional field left unset stays unset
                assert read_value is None, name
                continue
            assert torch.equal(sent_value, read_value)
            assert sent_value.dtype == read_value.dtype
    assert batches[0].sample_parents is None
    assert entry.batches[-1].sample_parents is not None  # a replayed step keeps its layout
    assert steps(journal) == [3]


def test_replay_runs_in_order_and_stops_at_a_gap(
    tmp_path: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    journal = StepJournal(tmp_path)
    for step in (5, 3, 4, 7):
        journal.append(step, step_batches(step), "pg", SHA)
    assert [e.step for e in journal.after(2)] == [3, 4, 5]  # 6 is missing: 7 is not replayed
    assert [e.step for e in journal.after(4)] == [5]
    assert list(journal.after(7)) == []
    journal.truncate(5)  # what resume does after replaying up to 5
    assert steps(journal) == [3, 4, 5]


def test_covered_entries_and_torn_writes_are_pruned_on_the_next_append(
    tmp_path: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    journal = StepJournal(tmp_path)
    for step in (1, 2, 3):
        journal.append(step, step_batches(step), "pg", SHA)
    torn = journal.root / ".tmp-step_00000004-deadbeef"
    torn.mkdir()
    (torn / "state.partial").write_bytes(b"half")
    journal.append(4, step_batches(4), "pg", SHA, covered_up_to=2)  # checkpoint of step 2
    assert steps(journal) == [3, 4] and not torn.exists()
    journal.discard(4)
    assert steps(journal) == [3]
    journal.truncate(0)  # a fresh start in a reused checkpoint folder
    assert steps(journal) == []


def test_a_damaged_entry_is_refused_naming_its_file(
    tmp_path: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    journal = StepJournal(tmp_path)
    journal.append(1, step_batches(1), "pg", SHA)
    path = state_file(journal.root / "step_00000001")
    assert path is not None
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="step_00000001"):
        list(journal.after(0))


def test_an_unset_interval_is_20_with_the_journal_and_1_without() -> None:
    """Durability does not depend on the trainer's kind: one that cannot journal (several
    ranks, `journal = false`, `tidal sft`) keeps a checkpoint every step by default."""
    assert CheckpointConfig().every(journaled=True) == JOURNALED_INTERVAL == 20
    assert CheckpointConfig().every(journaled=False) == 1
    assert CheckpointConfig(interval=5).every(journaled=True) == 5
    assert CheckpointConfig(interval=0).every(journaled=False) == 0


def test_an_entry_on_a_full_disk_raises_disk_full_and_leaks_no_temp_folder(
    tmp_path: Path,
    step_batches: Callable[[int], list[MicroBatchData]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    journal = StepJournal(tmp_path)
    journal.append(1, step_batches(1), "rl", SHA)

    def no_space(fd: int) -> None:  # a filesystem reports ENOSPC at fsync (NFS, quotas)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(DiskFull, match=r"disk full: .*journal.*could not be written") as err:
        journal.append(2, step_batches(2), "rl", SHA)
    assert err.value.needed_bytes and err.value.needed_bytes > 0
    monkeypatch.undo()
    assert steps(journal) == [1]
    assert sorted(p.name for p in journal.root.iterdir()) == ["step_00000001"]  # no temp left
