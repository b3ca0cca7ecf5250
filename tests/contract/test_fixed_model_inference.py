"""`inference.model_path`: a replica serving a fixed Hugging Face folder (a judge) is
SERVING version 0 at start with the folder's own tokenizer, with no weight-sync anywhere
(its address here is one nobody listens on), and answers chat completions over HTTP."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aiohttp

from tidal.cli.ports import free_address
from tidal.inference.config import OpenAIHttpConfig

from ..hf_folders import qwen3_folder
from .test_inference_service import inference_config, serving_inference

__all__ = ["qwen3_folder"]


async def test_a_fixed_folder_is_served_without_weight_sync(
    tmp_path: Path, qwen3_folder: Path
) -> None:
    class Nowhere:
        address = free_address()

    config = inference_config(Nowhere, tmp_path, "byte")  # the folder's tokenizer wins
    config.inference.model_path = qwen3_folder
    config.inference.http = OpenAIHttpConfig(enabled=True, served_model_name="judge")
    async with serving_inference(config) as inference:
        assert await inference.serving()
        assert inference.running.watcher is None
        status = await inference.status()
        assert status.policy_version == 0
        assert inference.running.http is not None
        body = {
            "model": "judge",
            "messages": [{"role": "user", "content": "Score 0-10:"}],
            "max_tokens": 4,
            "temperature": 0,
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{inference.running.http.url}/chat/completions", json=body) as reply,
        ):
            assert reply.status == 200, await reply.text()
            answer = await reply.json()
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert set(answer["choices"][0]["tidal"]["policy_versions"]) == {0}


def test_a_folder_without_config_is_refused_at_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tidal.inference", "--inference.model-path", str(tmp_path),
         "--security.mode", "plaintext"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"inference.model_path {tmp_path} has no config.json" in done.stderr
