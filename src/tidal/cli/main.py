"""The `tidal` command: dispatches to the launcher, one service, or the client.

Subcommands import their service lazily, so `tidal --help` and `tidal rl --dry-run` never
import torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

USAGE = """\
usage: tidal <command> [@ config.toml ...] [--section.key value ...] [--dry-run] [--help]

commands:
  rl             launch the local stack (all four services on loopback) and train;
                 an existing run folder needs --overwrite (replace) or --resume (continue)
  orchestrator   run the orchestrator service alone
  inference      run the inference service alone
  trainer        run the trainer service alone
  weightsync     run the weight-sync service alone
  sft            supervised fine-tuning on prompt/completion data (--resume continues)
  export         write a run's checkpoint or published version as a complete HF model folder
  import-model   convert a GGUF file into an HF model folder (FILE.gguf --out DIR [--dtype])
  client         talk to running services: status | generate | versions | progress
  certs          create a CA and per-role TLS certificates (--out DIR [--hosts a,b] [--tokens])
  plan           predict peak memory per rank (--memory 80GiB [--world-size N] [--fit] [--json])
  config-docs    regenerate docs/config.md's key reference from the config classes

Config files compose left to right; `TIDAL_SECTION__KEY` env vars and `--section.key value`
flags override them (flags win). `--dry-run` prints the resolved config as TOML.
`tidal <command> --help` lists the keys set first and the sections; `--help SECTION` one
section (`--help orchestrator.staleness`), `--help all` every key; docs/config.md has them all.
"""

ENTRY_POINTS = {
    "rl": "tidal.cli.launcher",
    "orchestrator": "tidal.orchestrator.main",
    "inference": "tidal.inference.main",
    "trainer": "tidal.trainer.launch",
    "weightsync": "tidal.weightsync.main",
    "sft": "tidal.trainer.sft",
    "export": "tidal.trainer.export",
    "import-model": "tidal.cli.import_model",
    "client": "tidal.cli.client",
    "certs": "tidal.common.security.credentials",
    "plan": "tidal.cli.memory_plan",
    "config-docs": "tidal.cli.config_docs",
}
"""Command → the module whose `main(argv)` runs it, imported only when that command runs."""


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        raise SystemExit(0 if args else 2)
    command, rest = args[0], args[1:]
    if command not in ENTRY_POINTS:
        print(f"error: unknown command {command!r}\n\n{USAGE}", file=sys.stderr, end="")
        raise SystemExit(2)
    importlib.import_module(ENTRY_POINTS[command]).main(rest)


if __name__ == "__main__":
    main()
