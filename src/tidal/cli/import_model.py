"""`tidal import-model FILE.gguf --out DIR [--dtype float32|bfloat16]`: a GGUF model as a
complete Hugging Face folder that `trainer.model.path` then points at.

The conversion is `tidal.models.gguf_import`; this module parses, reports and turns its
refusals into one line on stderr and exit status 2. Torch and transformers are imported
after parsing, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tidal.models.gguf_file import DEFAULT_DTYPE, DTYPES, GGUFImportError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tidal import-model",
        description="Dequantize a GGUF file into a Hugging Face model folder (weights, "
        "config.json with token ids, tokenizer files, chat template, generation_config.json); "
        "train it with --trainer.model.path DIR.",
    )
    p.add_argument("gguf", type=Path, help="the .gguf file")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder to write (atomically); an existing model folder there is replaced, any "
        "other non-empty folder is refused",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=DEFAULT_DTYPE,
        help="dtype of the dequantized weights (float32 holds them exactly; bfloat16 is half "
        "the size)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> None:
    opts = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    from tidal.models.gguf_import import import_gguf  # torch and transformers: after parsing
    from tidal.models.hf_config import ModelFolderError

    start = time.monotonic()
    try:
        imported = import_gguf(opts.gguf, opts.out, dtype=opts.dtype)
    except (GGUFImportError, ModelFolderError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    types = ", ".join(f"{n} {name}" for name, n in sorted(imported.tensor_types.items()))
    ids = ", ".join(f"{k} {v}" for k, v in sorted(imported.token_ids.items()))
    print(
        f"tidal import-model: {opts.gguf} -> {imported.folder} in "
        f"{time.monotonic() - start:.0f} s\n"
        f"  {imported.family}, {imported.parameters / 1e6:.1f}M parameters in {imported.dtype} "
        f"(dequantized from {types})\n"
        f"  token ids: {ids}\n"
        f"  files: {', '.join(imported.files)}\n"
        f"  train it: tidal rl @ configs/default.toml --trainer.model.path {imported.folder}"
    )
