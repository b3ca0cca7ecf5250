"""Optional W&B logging (`[orchestrator.wandb]`).

wandb itself is not installed here (it does not install from this machine's local
package indexes), so what is tested is ours: the clear error when it is enabled without
the extra (in the orchestrator and in `tidal rl`, before anything starts), and the sink's
use of wandb's public API (`init`, `Run.log`, `Run.finish`), recorded by a stand-in module.
A real W&B run (offline mode) has not been exercised.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tidal.cli.main import main
from tidal.common.errors import ConfigError
from tidal.orchestrator.config import WandbConfig
from tidal.orchestrator.records.run_log import StepRecord
from tidal.orchestrator.records.wandb_sink import RUN_ID_FILE, WandbSink, import_wandb

ROOT = Path(__file__).resolve().parents[4]
no_wandb = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is not None, reason="wandb is installed"
)


@no_wandb
def test_enabled_without_wandb_names_the_key_and_the_extra() -> None:
    with pytest.raises(ConfigError) as err:
        import_wandb()
    assert "orchestrator.wandb.enabled" in str(err.value)
    assert "tidal-orchestrator[wandb]" in str(err.value)


@no_wandb
def test_tidal_rl_refuses_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["rl", "@", str(ROOT / "configs" / "default.toml"), "--orchestrator.wandb.enabled"]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--run.output-dir", str(tmp_path)])
    assert exit_.value.code == 2
    assert "tidal-orchestrator[wandb]" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # no run folder, no service started


class _Run:
    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, Any], int]] = []
        self.finished = False

    def log(self, data: dict[str, Any], step: int) -> None:
        self.logged.append((data, step))

    def finish(self) -> None:
        self.finished = True


def _stand_in(inits: list[dict[str, Any]]) -> ModuleType:
    module = ModuleType("wandb")

    def init(**kwargs: Any) -> _Run:
        inits.append(kwargs)
        return _Run()

    module.init = init  # type: ignore[attr-defined]
    return module


def test_sink_logs_each_step_to_one_run_kept_across_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inits: list[dict[str, Any]] = []
    monkeypatch.setitem(sys.modules, "wandb", _stand_in(inits))
    config = WandbConfig(enabled=True, project="p", mode="offline", tags=["cpu"])
    sink = WandbSink.start(config, run_name="demo", run_dir=tmp_path, settings={"seed": 0})
    step = StepRecord.lost(7)
    step.reward_mean, step.generated_tokens = 0.5, 12
    sink(step)
    sink.finish()
    [(logged, at)] = sink.run.logged
    assert at == 7
    assert logged["reward_mean"] == 0.5 and logged["generated_tokens"] == 12
    assert "step" not in logged and "phase" not in logged  # numbers only, step is the axis
    assert sink.run.finished
    again = WandbSink.start(config, run_name="demo", run_dir=tmp_path, settings={})
    assert again is not None
    first, second = inits
    assert first["id"] == second["id"] == (tmp_path / RUN_ID_FILE).read_text().strip()
    assert first["resume"] == "allow" and first["mode"] == "offline"
    assert first["name"] == "demo" and first["project"] == "p" and first["dir"] == str(tmp_path)
