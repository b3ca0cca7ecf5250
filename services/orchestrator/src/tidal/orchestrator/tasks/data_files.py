"""Rows of a local dataset: a JSONL file line by line, everything else through `datasets`.

JSONL keeps its own reader so a bad line is skipped with its number (the Arrow JSON reader
rejects the whole file). Other files and folders go through `datasets`, offline only (a
path typo is an error, never a download) and imported only when a dataset is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.common.errors import ConfigError

DATA_FILE_BUILDERS = {".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


@dataclass
class Rows:
    """The rows of one source: (line or row number, decoded object or the exception)."""

    label: str
    """File (and split) the rows came from, for messages."""
    rows: list[tuple[int, Any]]
    columns: list[str] | None = None
    """Column names of a columnar source (None for JSONL: each line has its own)."""

    def fields(self) -> list[str]:
        """Every field name seen in the source."""
        if self.columns is not None:
            return list(self.columns)
        seen: dict[str, None] = {}
        for _, raw in self.rows:
            if isinstance(raw, dict):
                seen.update(dict.fromkeys(map(str, raw)))
        return list(seen)


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, exc


def _import_datasets() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError as exc:  # a core dependency; only a broken install lacks it
        raise ConfigError(f"reading datasets needs the `datasets` package: {exc}") from exc
    datasets.disable_progress_bars()
    return datasets


def _pick_split(loaded: Any, split: str | None, label: str) -> tuple[Any, str]:
    """The one Dataset of a DatasetDict (by name, the only one, or "train")."""
    if not hasattr(loaded, "keys"):  # a single Dataset
        if split is not None:
            raise ConfigError(f"orchestrator task {label}: has no splits, but split = {split!r}")
        return loaded, label
    names = sorted(loaded.keys())
    if split is None:
        split = names[0] if len(names) == 1 else "train"
    if split not in loaded:
        raise ConfigError(f"orchestrator task {label}: no split {split!r} (splits: {names})")
    return loaded[split], f"{label}[{split}]"


def _load_with_datasets(path: Path, split: str | None) -> tuple[Any, str]:
    datasets = _import_datasets()
    label = str(path)
    try:
        if path.is_dir() and (
            (path / "dataset_dict.json").is_file() or (path / "dataset_info.json").is_file()
        ):
            loaded = datasets.load_from_disk(str(path))
        elif path.is_dir():
            loaded = datasets.load_dataset(str(path))
        else:
            builder = DATA_FILE_BUILDERS[path.suffix]
            loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
    except (ValueError, OSError, datasets.exceptions.DatasetGenerationError) as exc:
        raise ConfigError(f"orchestrator task {label}: cannot read: {exc}") from exc
    return _pick_split(loaded, split, label)


def read_rows(path: Path, *, split: str | None = None) -> Rows:
    """Every row of the file or folder at `path` (of `split`, for a multi-split folder)."""
    if path.is_file() and path.suffix == ".jsonl":
        if split is not None:
            raise ConfigError(f"orchestrator task {path}: a .jsonl file has no split {split!r}")
        return Rows(str(path), list(_jsonl_rows(path)))
    if path.is_file() and path.suffix not in DATA_FILE_BUILDERS:
        raise ConfigError(
            f"orchestrator task dataset {path}: unknown format {path.suffix!r}; use .jsonl, "
            f"{', '.join(DATA_FILE_BUILDERS)} or a folder"
        )
    if not path.exists():
        raise ConfigError(f"orchestrator task dataset: no file {path}")
    dataset, label = _load_with_datasets(path, split)
    return Rows(label, list(enumerate(dataset, start=1)), list(dataset.column_names))
