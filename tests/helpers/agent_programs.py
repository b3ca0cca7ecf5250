"""Agent programs the gateway tests write to disk and run as processes of their own.

`REACT_AGENT` is a ReAct loop on the `openai` client: it sends the problem's messages and
tools, runs the `lookup` tool itself on each call the policy makes (from the table in the
problem's metadata), sends the result back and prints the final answer. With `--serve PORT`
it is a long-running agent service that plays each episode POSTed to it. `ASYNC_REACT_AGENT`
is the same loop as a service on aiohttp with plain JSON (one event loop and one pool of
kept-alive connections for all episodes): the light agent the gateway benchmark runs, so
that what it measures is the gateway more than the agent's client. `CURL_AGENT` is a
POSIX shell script with curl and jq: one chat call, its answer printed. Neither knows Tidal
beyond the environment an OpenAI program reads (OPENAI_BASE_URL, OPENAI_API_KEY).
`self_rewarding_task` writes the run's config layer that plays such a program per episode.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import stat
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from tidal.orchestrator.scoring.sandbox.isolation import python_for_programs

REACT_AGENT = r'''
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from openai import OpenAI

HTTP = httpx.Client(timeout=120)  # one connection pool for all episodes of the service
STREAM = "--stream" in sys.argv


def lookup(problem, key):
    return str(problem["metadata"]["table"].get(key, "no such key"))


def chat(client, messages, tools):
    if not STREAM:
        return client.chat.completions.create(model="policy", messages=messages, tools=tools)
    with client.chat.completions.stream(model="policy", messages=messages, tools=tools) as s:
        return s.get_final_completion()


def play(client, problem, max_turns=4):
    """The ReAct loop: act (tool calls) until the policy answers."""
    messages = list(problem["messages"])
    tools = problem["tools"] or None
    for _ in range(max_turns):
        message = chat(client, messages, tools).choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"parsed"}))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments or "{}")
            result = lookup(problem, arguments.get("key", ""))
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "name": "lookup", "content": result}
            )
    return ""


class Episodes(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the orchestrator reuses its connections

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        client = OpenAI(
            base_url=body["base_url"], api_key=body["api_key"], max_retries=0, http_client=HTTP
        )
        try:
            output = play(client, body["problem"])
        except Exception as exc:  # the episode failed; the service goes on
            output = f"error: {exc}"
        data = json.dumps({"output": output}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    request_queue_size = 256  # a step's episodes arrive at once


if len(sys.argv) > 2 and sys.argv[1] == "--serve":
    server = Server(("127.0.0.1", int(sys.argv[2])), Episodes)
    print(f"serving on {server.server_address[1]}", flush=True)
    server.serve_forever()
else:
    problem = json.loads(sys.stdin.read())
    print(play(OpenAI(max_retries=0), problem))
'''

ASYNC_REACT_AGENT = r'''
import asyncio, json, sys

import aiohttp
from aiohttp import web


def lookup(problem, key):
    return str(problem["metadata"]["table"].get(key, "no such key"))


async def play(http, base_url, api_key, problem, max_turns=4):
    """The ReAct loop: act (tool calls) until the policy answers."""
    headers = {"Authorization": f"Bearer {api_key}"}
    messages = list(problem["messages"])
    body = {"model": "policy", "messages": messages}
    if problem["tools"]:
        body["tools"] = problem["tools"]
    for _ in range(max_turns):
        async with http.post(f"{base_url}/chat/completions", json=body, headers=headers) as r:
            r.raise_for_status()
            message = (await r.json())["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if v is not None})
        if not message.get("tool_calls"):
            return message.get("content") or ""
        for call in message["tool_calls"]:
            arguments = json.loads(call["function"]["arguments"] or "{}")
            result = lookup(problem, arguments.get("key", ""))
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "name": "lookup", "content": result}
            )
    return ""


async def episode(request):
    body = await request.json()
    try:
        output = await play(request.app["http"], body["base_url"], body["api_key"], body["problem"])
    except Exception as exc:  # the episode failed; the service goes on
        output = f"error: {exc}"
    return web.json_response({"output": output})


async def serve(port):
    app = web.Application()
    app.router.add_post("/", episode)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        app["http"] = http
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=256).start()
        print(f"serving on {port}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[2])))
'''

CURL_AGENT = r"""#!/bin/sh
# one chat call with the problem's messages; its answer is the output
set -eu
problem=$(cat)
body=$(printf '%s' "$problem" | jq -c '{model: "policy", messages: .messages}')
reply=$(curl -sS --fail-with-body -H "Authorization: Bearer $OPENAI_API_KEY" \
  -H "Content-Type: application/json" -d "$body" "$OPENAI_BASE_URL/chat/completions")
printf '%s' "$reply" | jq -r '.choices[0].message.content'
if [ "${1:-}" = "--reward" ]; then
  curl -sS --fail-with-body -H "Authorization: Bearer $OPENAI_API_KEY" \
    -H "Content-Type: application/json" -d '{"reward": 1.0}' "$TIDAL_REWARD_URL" >/dev/null
fi
"""


@contextlib.contextmanager
def agent_folder() -> Iterator[Path]:
    """A folder for agent programs that sandbox uids can reach for a whole run: a fresh
    one under the temp dir, not under pytest's, whose base folder any pytest session that
    starts meanwhile makes private again (0700)."""
    folder = Path(tempfile.mkdtemp(prefix="tidal-test-agent-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_agent(folder: Path, name: str, source: str) -> Path:
    """`source` as an executable file in `folder`, readable by the sandbox's uids."""
    path = folder / name
    path.write_text(source)
    path.chmod(path.stat().st_mode | stat.S_IRWXU | stat.S_IROTH | stat.S_IXOTH)
    for parent in [folder, *folder.parents]:
        if parent == Path(parent.anchor):
            break
        parent.chmod(parent.stat().st_mode | stat.S_IXOTH)
    return path


def react_command(folder: Path, *, stream: bool = False) -> list[str]:
    """The argv that runs the ReAct agent in the sandbox: an interpreter its uids can run,
    with this environment's packages (`openai`) on its path."""
    agent = write_agent(folder, "react_agent.py", REACT_AGENT)
    site = sysconfig.get_paths()["purelib"]
    python = python_for_programs(None)
    return ["/usr/bin/env", f"PYTHONPATH={site}", python, "-u", str(agent)] + (
        ["--stream"] if stream else []
    )


def react_files(folder: Path) -> list[str]:
    """What the ReAct agent reads besides its interpreter (`files` of its task): its script
    and this environment's packages."""
    return [str(folder / "react_agent.py"), sysconfig.get_paths()["purelib"]]


def react_service(folder: Path) -> list[str]:
    """The argv of the ReAct agent as a long-running service (append `--serve PORT`)."""
    return [sys.executable, "-u", str(write_agent(folder, "react_agent.py", REACT_AGENT))]


def async_react_service(folder: Path) -> list[str]:
    """The argv of the light ReAct agent service (append `--serve PORT`)."""
    program = write_agent(folder, "async_react_agent.py", ASYNC_REACT_AGENT)
    return [sys.executable, "-u", str(program)]


def curl_command(folder: Path, *, reward: bool = False) -> list[str]:
    """The curl agent's argv; with `reward` it posts reward 1.0 for its episode."""
    script = str(write_agent(folder, "curl_agent.sh", CURL_AGENT))
    return [script, "--reward"] if reward else [script]


def self_rewarding_task(path: Path, command: Sequence[str]) -> Path:
    """A config layer at `path` (TOML) whose task runs `command` in the sandbox once per
    episode of the reversal problems, chat template on; the program posts its own reward
    (`self_reward`) within 60 s."""
    path.write_text(
        "[orchestrator.task]\n"
        'type = "agent"\n'
        f"command = {json.dumps(list(command))}\n"
        "self_reward = true\n"
        "deadline_s = 60.0\n"
        "[orchestrator.task.problems]\n"
        'type = "reversal"\n'
        "[orchestrator.chat]\n"
        'template = "on"\n'
    )
    return path
