"""Agent gateway: the lookup tool task through an agent program vs the built-in episode loop.

The real stack (`tidal rl @ configs/lookup.toml`: the tiny byte-level model, native
inference, the trainer), 8 prompts x 8 episodes a step, RL only from one warmed-up model
(`configs/lookup.toml`'s supervised warm-up, once, first; `--model` reuses a folder).
Arms, run alternately `--repeats` times so load on a shared machine hits them alike:
- builtin: `type = "lookup"`, the orchestrator's own tool loop;
- gateway-light, gateway-openai (`--agents`): `type = "agent"` over the same problems,
  played by a ReAct agent as a long-running agent service that runs `lookup` itself and
  talks to the session gateway (tests/helpers/agent_programs.py): `light` on aiohttp with
  plain JSON, so the arm measures the gateway more than the agent's client; `openai` on
  the `openai` client, threads and pydantic models.
Per step from metrics.jsonl (the first `SKIP` RL steps left out): `seconds` (step),
`generate_seconds` (rollout). At `--max-async 0` (the default) a step is its rollout then
its training, so the gateway's whole cost shows in the step; at the config's own 1 the
next rollout runs while the trainer trains, as a run of `configs/lookup.toml` does.
Ratios: arm / builtin of the pooled medians. A step's time follows what the policy does
(more tool calls, longer episodes, as it learns), and two runs of RL learn apart: with
`--frozen-policy` both arms train at lr 1e-12, so every step of both samples one policy
and the ratio is the gateway's cost alone (learning through it is tested elsewhere). CPU:
the stack's per run (start-up included) from the waited-for children's rusage, the agent
service's from /proc. `--micro` instead times, in this process, the gateway's own work for
a two-call lookup episode (parse each request, render its prompt, record the turn, build
the reply; no HTTP, no model). `--path` times the orchestrator's CPU per episode along
each arm's whole rollout path (the built-in loop; the gateway over HTTP with the light
agent service as a process), a step's 64 episodes at a time, with a stand-in for inference
that answers each turn at once.

    python bench/agent_gateway.py [--repeats 2] [--steps 12] [--agents light,openai]
                                  [--max-async 0] [--frozen-policy]
                                  [--warmup-steps 200 | --model WARMED_FOLDER]
    python bench/agent_gateway.py --micro | --path
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from common import ROOT, print_table, write_result

sys.path.insert(0, str(ROOT))
from tests.helpers.agent_programs import async_react_service, react_service
from tidal.orchestrator.records.run_log import run_log_records

AGENTS = {"light": async_react_service, "openai": react_service}

CONFIG = ROOT / "configs" / "lookup.toml"
SKIP = 2  # first RL steps left out: the pipeline fills, the engine warms up
PROMPTS, GROUP = 8, 8
FROZEN_LR = 1e-12  # steps far below the weights' precision: the policy stays put
STEP_KEYS = ("step", "generate_seconds", "seconds", "samples", "reward_mean")


def tidal_rl(args: list[str], *, out: Path, name: str) -> list[dict[str, Any]]:
    command = [
        sys.executable, "-m", "tidal.cli", "rl", "@", str(CONFIG), *args,
        "--run.output-dir", str(out), "--run.name", name,
        "--orchestrator.report.table-every", "0",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return run_log_records(out / name / "metrics.jsonl")


def agent_overlay(path: Path, port: int) -> Path:
    """The TOML that plays the lookup problems through the agent service."""
    path.write_text(
        f'[orchestrator.task]\ntype = "agent"\nurl = "http://127.0.0.1:{port}/"\n'
        '[orchestrator.task.problems]\ntype = "lookup"\nkey_len = 1\nvalue_len = 1\n'
        "guess_fraction = 0.5\n"
    )
    return path


def run_steps(
    model: Path, extra: list[str], *, steps: int, max_async: int, frozen: bool, out: Path, name: str
) -> list[dict]:  # type: ignore[type-arg]
    args = [
        *extra, *(["--trainer.optim.lr", str(FROZEN_LR)] if frozen else []),
        "--trainer.model.path", str(model), "--run.tokenizer", "byte",
        "--orchestrator.warmup-steps", "0", "--orchestrator.steps", str(steps),
        "--orchestrator.staleness.max-async", str(max_async),
        "--orchestrator.prompts-per-step", str(PROMPTS),
        "--orchestrator.group-size", str(GROUP),
    ]  # fmt: skip
    return [r for r in tidal_rl(args, out=out, name=name) if r["phase"] == "rl"][SKIP:]


def figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    def med(key: str) -> float:
        return statistics.median(float(r.get(key) or 0.0) for r in rows)

    return {
        "step_s": med("seconds"),
        "rollout_s": med("generate_seconds"),
        "episodes": med("samples"),
        "reward": statistics.mean(float(r["reward_mean"]) for r in rows),
        "calls_per_episode": med("tools/calls_per_episode"),
    }


def gateway_ms_per_episode(repeats: int = 200) -> float:
    """The gateway's CPU for one lookup episode of two calls (a call, then the answer)."""
    import time

    from tidal.orchestrator.completions import Completion
    from tidal.orchestrator.gateway.chat_reply import ChatReply, ChoiceReply
    from tidal.orchestrator.gateway.chat_request import message_key, parse_chat_call
    from tidal.orchestrator.gateway.trace import EpisodeTrace, RecordedTurn
    from tidal.orchestrator.task_config import LookupTaskConfig
    from tidal.orchestrator.tasks.lookup import LookupTask
    from tidal.text.byte import ByteTokenizer
    from tidal.text.conversation import ChatRendering
    from tidal.text.tool_calls import tool_call_parser

    tokenizer = ByteTokenizer()
    parser = tool_call_parser(tokenizer, "auto")
    task = LookupTask(LookupTaskConfig(key_len=1, value_len=1))
    task.bind(name="lookup", seed=0)
    problem = task.problem(0)
    ask = {"role": "user", "content": problem.prompt}

    def call(trace: EpisodeTrace, messages: list[dict[str, Any]], text: str) -> dict[str, Any]:
        request = parse_chat_call(
            json.loads(json.dumps({"messages": messages, "tools": list(problem.tools)}))
        )
        pending = trace.prompt(request.messages, request.keys, request.tools)
        ids = (*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_id)
        turn = Completion(0, ids, tuple(-0.5 for _ in ids), tuple(1 for _ in ids), True)
        decoded = tokenizer.decode(ids)
        parsed = parser.parse(decoded, request.tools)
        choice = ChoiceReply(turn, parsed)
        message = choice.message()
        key = message_key(choice.key_message(message))
        trace.record(pending, [RecordedTurn(turn, decoded, parsed, key)])
        reply = ChatReply("policy", (choice,), (message,), len(pending.ids))
        json.dumps(reply.whole())
        return message

    started = time.perf_counter()
    for _ in range(repeats):
        trace = EpisodeTrace(ChatRendering(tokenizer, True))
        message = call(trace, [ask], f'<call>lookup {{"key": "{problem.prompt}"}}</call>')
        result = {"role": "tool", "content": problem.reference}
        call(trace, [ask, message, result], problem.reference)
    return (time.perf_counter() - started) / repeats * 1000


class ScriptedSampler:
    """`--path`'s stand-in for the rollout generator: the real prompt rendering and
    parsers, and a `complete` that answers at once with a lookup episode's script (the
    call, then the value), so what is timed is the orchestrator's own work."""

    def __init__(self) -> None:
        from tidal.orchestrator.config import ChatConfig
        from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
        from tidal.text.byte import ByteTokenizer

        self.tokenizer = ByteTokenizer()
        self.prompts = PromptRenderer.from_config(self.tokenizer, ChatConfig(template="on"))
        self.inference = SimpleNamespace(max_seq_len=512)
        self.max_tokens = 64
        self.problems: dict[str, Any] = {}
        """Request tag (a group's `request_id`) → its problem."""

    def answer_of(self, text: str) -> str:
        return text

    def top_p(self, temperature: float) -> float:
        return 1.0

    async def complete(self, prompt_ids: list[int], *, n: int, request_id: str, **_: Any) -> list:  # type: ignore[type-arg]
        from tidal.orchestrator.completions import Completion

        tag, _, turn = request_id.rpartition("-")  # tag-e{i}-t{k} built-in, -c{k} gateway
        problem = self.problems[tag.rpartition("-e")[0]]
        first = turn[1:] == "0"
        text = f'<call>lookup {{"key": "{problem.prompt}"}}</call>' if first else problem.reference
        ids = (*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_id)
        return [Completion(0, ids, (-0.5,) * len(ids), (1,) * len(ids), True)] * n


def orchestrator_ms_per_episode(arm: str, *, steps: int, folder: Path) -> tuple[float, float]:
    """`--path`: CPU ms per lookup episode of this process (the orchestrator's rollout
    path) and of the agent service, `steps` steps of 64 episodes through the arm's real
    rollout strategy (the gateway and a light agent process, or the built-in loop)."""
    import asyncio
    import time

    from tidal.orchestrator.config import ToolsConfig
    from tidal.orchestrator.rollouts.strategies import rollout_strategy
    from tidal.orchestrator.task_config import AgentTaskConfig, LookupTaskConfig
    from tidal.orchestrator.tasks.registry import build_task
    from tidal.text.tool_calls import tool_call_parser

    lookup = LookupTaskConfig(key_len=1, value_len=1, guess_fraction=0.5)
    service = None
    if arm == "builtin":
        task = build_task(lookup, seed=0)
    else:
        service, port = start_agent(AGENTS["light"](folder))
        url = f"http://127.0.0.1:{port}/"
        task = build_task(AgentTaskConfig(url=url, problems=lookup.model_dump()), seed=0)
    task.bind(name="lookup", seed=0)
    sampler = ScriptedSampler()
    strategy = rollout_strategy(task, tool_call_parser(sampler.tokenizer, "auto"), ToolsConfig())

    async def step(index: int) -> None:
        groups = []
        for i in range(PROMPTS):
            problem = task.problem(index * PROMPTS + i)
            tag = f"step{index}-prompt{i}"
            sampler.problems[tag] = problem
            prompt = sampler.prompts.prompt_ids(problem)
            sampling = {"temperature": 1.0, "seed": index, "request_id": tag}
            groups.append(strategy(sampler, problem, prompt, n=GROUP, **sampling))
        episodes = [c for group in await asyncio.gather(*groups) for c in group]
        assert not any(c.dropped for c in episodes), "an episode was dropped"

    async def run() -> tuple[float, float]:
        await step(steps)  # connections and caches warm
        agent_before = cpu_seconds(service.pid) if service else 0.0
        started = time.process_time()
        for index in range(steps):
            await step(index)
        ours = time.process_time() - started
        agent = cpu_seconds(service.pid) - agent_before if service else 0.0
        close = getattr(strategy, "aclose", None)
        if close is not None:
            await close()
        episodes = steps * PROMPTS * GROUP
        return ours / episodes * 1000, agent / episodes * 1000

    try:
        return asyncio.run(run())
    finally:
        if service is not None:
            service.kill()
            service.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU a live process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """User + system CPU of the waited-for children (the `tidal rl` runs, all services)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start_agent(program: list[str]) -> tuple[subprocess.Popen[str], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    service = subprocess.Popen([*program, "--serve", str(port)], stdout=subprocess.PIPE, text=True)
    assert service.stdout is not None and "serving" in service.stdout.readline()
    return service, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--model", type=Path, help="a warmed-up model folder")
    parser.add_argument(
        "--agents", default="light,openai", help="gateway arms, comma-separated: light, openai"
    )
    parser.add_argument(
        "--max-async", type=int, default=0, help="0: rollout then training; 1: lookup.toml's"
    )
    parser.add_argument(
        "--frozen-policy",
        action="store_true",
        help="train at lr 1e-12: every step samples the same policy in both arms",
    )
    parser.add_argument("--micro", action="store_true", help="time the gateway's own work")
    parser.add_argument(
        "--path", action="store_true", help="time the orchestrator's rollout path, no model"
    )
    args = parser.parse_args()
    if args.micro:
        print(f"gateway CPU per two-call episode: {gateway_ms_per_episode():.2f} ms")
        return
    if args.path:
        with tempfile.TemporaryDirectory(prefix="tidal-bench-gateway-") as tmp:
            for arm in ("builtin", "gateway-light"):
                ours, agent = orchestrator_ms_per_episode(arm, steps=40, folder=Path(tmp))
                print(f"{arm}: orchestrator {ours:.3f} ms, agent {agent:.3f} ms per episode")
        return
    agents = args.agents.split(",")
    if not agents or any(a not in AGENTS for a in agents):
        parser.error(f"--agents: each of {', '.join(AGENTS)}")
    arms = ["builtin", *(f"gateway-{a}" for a in agents)]
    runs: dict[str, list[list[dict[str, Any]]]] = {arm: [] for arm in arms}
    # per run: the stack's CPU seconds (start-up included) and the agent service's
    cpu: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-gateway-") as tmp, ExitStack() as stack:
        out = Path(tmp)
        model = args.model
        if model is None:
            warmup = ["--orchestrator.warmup-steps", str(args.warmup_steps)]
            tidal_rl([*warmup, "--orchestrator.steps", "1"], out=out, name="warmup")
            model = out / "warmup" / "weights" / f"v{args.warmup_steps:06d}"
        extra: dict[str, list[str]] = {"builtin": []}
        services: dict[str, subprocess.Popen[str]] = {}
        for agent in agents:
            service, port = start_agent(AGENTS[agent](out))
            stack.callback(service.wait)
            stack.callback(service.kill)
            services[f"gateway-{agent}"] = service
            overlay = agent_overlay(out / f"{agent}.toml", port)
            extra[f"gateway-{agent}"] = ["@", str(overlay)]
        for repeat in range(args.repeats):
            for arm in arms if repeat % 2 == 0 else reversed(arms):
                service = services.get(arm)
                agent_before = cpu_seconds(service.pid) if service else 0.0
                stack_before = children_cpu_seconds()
                name = f"{arm}-{repeat}"
                settings = {
                    "steps": args.steps,
                    "max_async": args.max_async,
                    "frozen": args.frozen_policy,
                }
                runs[arm].append(run_steps(model, extra[arm], **settings, out=out, name=name))
                agent_cpu = cpu_seconds(service.pid) - agent_before if service else 0.0
                cpu[arm].append((children_cpu_seconds() - stack_before, agent_cpu))
    pooled = {arm: figures([r for run in rs for r in run]) for arm, rs in runs.items()}
    base = pooled["builtin"]
    rows = [
        {
            "arm": arm,
            "step s": m["step_s"],
            "step ratio": m["step_s"] / base["step_s"],
            "rollout s": m["rollout_s"],
            "rollout ratio": m["rollout_s"] / base["rollout_s"],
            "stack cpu s/run": statistics.mean(c for c, _ in cpu[arm]),
            "agent cpu ms/episode": statistics.mean(a for _, a in cpu[arm])
            / (args.steps * PROMPTS * GROUP)
            * 1000,
            "calls/episode": m["calls_per_episode"],
            "reward": m["reward"],
        }
        for arm, m in pooled.items()
    ]
    print_table(f"{PROMPTS * GROUP} lookup episodes a step: gateway vs built-in (medians)", rows)
    summary = {
        f"step_ratio_{row['arm']}": row["step ratio"] for row in rows if row["arm"] != "builtin"
    }
    config = {
        "run_config": "configs/lookup.toml",
        "prompts_per_step": PROMPTS,
        "group_size": GROUP,
        "max_async": args.max_async,
        "frozen_policy": args.frozen_policy,
        "warmup_steps": 0 if args.model else args.warmup_steps,
        "rl_steps": args.steps,
        "skipped_first_rl_steps": SKIP,
        "repeats": args.repeats,
        "agents": agents,
        "per_run_steps": {
            arm: [[{k: r.get(k) for k in STEP_KEYS} for r in run] for run in v]
            for arm, v in runs.items()
        },
        "per_run_cpu_s": {arm: [list(c) for c in v] for arm, v in cpu.items()},
    }
    path = write_result("agent_gateway", config=config, results=rows, summary=summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
