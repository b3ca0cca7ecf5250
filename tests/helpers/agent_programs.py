"""Agent programs the gateway tests write to disk and run as processes of their own.

`REACT_AGENT` is a ReAct loop on the `openai` client: it sends the problem's messages and
tools, runs the `lookup` tool itself on each call the policy makes (from the table in the
problem's metadata), sends the result back and prints the final answer. With `--serve PORT`
it is a long-running agent service that plays each episode POSTed to it. `CURL_AGENT` is a
POSIX shell script with curl and jq: one chat call, its answer printed. Neither knows Tidal
beyond the environment an OpenAI program reads (OPENAI_BASE_URL, OPENAI_API_KEY).
"""

from __future__ import annotations

import stat
import sys
import sysconfig
from pathlib import Path

from tidal.orchestrator.scoring.sandbox.executor import python_for_programs

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


def curl_command(folder: Path, *, reward: bool = False) -> list[str]:
    """The curl agent's argv; with `reward` it posts reward 1.0 for its episode."""
    script = str(write_agent(folder, "curl_agent.sh", CURL_AGENT))
    return [script, "--reward"] if reward else [script]
