"""`make bench`: run every benchmark script in `bench/` in its own process.

`python bench/run_all.py [name ...]` runs the named ones only (e.g. `trainer inference`).
A failing benchmark is reported and the rest still run; the exit code is non-zero if any
failed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOT_BENCHMARKS = {
    "run_all",
    "common",
    "distill_tasks",  # bench/distill.py's task definitions
    "inference_kv",
    "inference_step",
    "rl_same_tokenizer",
    "rl_smollm2",
    "slow_lookup_task",
    "smollm2_recipe",  # needs --model-folder and runs three 30-minute seeds
    "gpu_check",
    "gpu_stages",
}


def main(argv: list[str]) -> int:
    names = argv or sorted(p.stem for p in HERE.glob("*.py") if p.stem not in NOT_BENCHMARKS)
    failed = []
    for name in names:
        print(f"== bench/{name}.py", flush=True)
        code = subprocess.call([sys.executable, str(HERE / f"{name}.py")], cwd=HERE.parent)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
