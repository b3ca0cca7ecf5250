"""Real-data tasks keep the orchestrator torch-free and offline when they are built and used.

`test_no_torch.py` imports every module; `datasets`, `math_verify` and `reasoning_gym` are
imported only when a task needs them, so this builds each such task and scores with it,
in a fresh interpreter whose sockets refuse to connect.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import socket, sys
def refuse(*args, **kwargs):
    raise OSError("network use in an offline test")
socket.socket.connect = refuse
socket.create_connection = refuse

from pathlib import Path
import datasets
from tidal.orchestrator.task_config import DatasetTaskConfig, ReasoningGymTaskConfig
from tidal.orchestrator.tasks import build_task

folder = Path(sys.argv[1])
rows = [{"question": f"{i}+{i}=", "answer": f"#### {2 * i}"} for i in range(4)]
datasets.Dataset.from_list(rows).to_parquet(str(folder / "gsm.parquet"))
math = build_task(DatasetTaskConfig(
    path=folder / "gsm.parquet", prompt_field="question", verifier="math", eval_fraction=0
))
assert math.verify(math.problem(0), "\\\\boxed{" + math.problem(0).answer[5:] + "}").reward == 1.0
gym = build_task(ReasoningGymTaskConfig(dataset="basic_arithmetic"), seed=1)
problem = gym.problem(0)
assert gym.verify(problem, problem.answer).reward == 1.0
assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
print("ok")
"""


def test_building_and_scoring_real_tasks_imports_no_torch_and_needs_no_network(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
