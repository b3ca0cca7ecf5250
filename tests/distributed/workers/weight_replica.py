"""A real inference replica in its own process, for the weight-sync path tests.

Runs the native engine behind the real `WeightWatcher` until it serves `--until`, then
writes what it was handed (`update_weights`' state dict, bit for bit) to
`<out>/v<version>.safetensors` per version, and `<out>/done.json` with which versions
arrived by broadcast. Only the recording of the delivered tensors is added to the
engine; loading them is the engine's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.inference.config import InferenceConfig
from tidal.inference.native import NativeEngine
from tidal.inference.reload import WeightWatcher
from tidal.weights.client import WeightSyncClient

# The engine's per-step token budget and KV-cache bound, at their configured defaults.
ENGINE_BUDGET = {
    "max_step_tokens": InferenceConfig().max_step_tokens,
    "kv_cache_mb": InferenceConfig().kv_cache_mb,
}


class RecordingEngine(NativeEngine):
    def __init__(self, out: Path) -> None:
        super().__init__(
            device=torch.device("cpu"),
            dtype=torch.float32,
            max_batch_size=4,
            max_queue=4,
            **ENGINE_BUDGET,
            seed=0,
        )
        self.out = out

    async def update_weights(
        self, version: int, hf_config: dict[str, Any], state_dict: dict[str, torch.Tensor]
    ) -> None:
        save_file(
            {k: v.contiguous() for k, v in state_dict.items()}, self.out / f"v{version}.safetensors"
        )
        await super().update_weights(version, hf_config, state_dict)


async def main(address: str, replica_id: str, out: Path, until: int) -> None:
    engine = RecordingEngine(out)
    await engine.start()
    client = WeightSyncClient(address, security=PLAINTEXT_LOOPBACK)
    watcher = WeightWatcher(client, engine, replica_id)
    task = asyncio.create_task(watcher.run())
    while watcher.acked < until:
        await asyncio.sleep(0.05)
    (out / "done.json").write_text(
        json.dumps({"broadcast": watcher.received_by_broadcast, "served": engine.policy_version})
    )
    task.cancel()
    await engine.close()
    await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--until", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(main(args.address, args.replica_id, args.out, args.until))
