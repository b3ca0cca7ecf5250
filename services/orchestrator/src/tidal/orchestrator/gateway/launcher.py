"""Starts an agent program inside the sandbox, its OpenAI endpoint a relay to the gateway.

Run by the sandbox as its program (`python -I -S`, standard library only). It reads its
spec from `tidal_agent.json` in the work dir and deletes it, makes sure 127.0.0.1 works in
its network namespace (up under bubblewrap; in the fallback's namespace it asks the
gateway to raise `lo` over the gateway's Unix socket), relays a loopback port to that
socket, and runs the agent with OPENAI_BASE_URL pointing at the port; it exits with the
agent's status. The agent inherits stdin (the problem), stdout (its final output) and
stderr.
"""

import asyncio
import http.client
import json
import os
import socket
import sys

SPEC = "tidal_agent.json"
EXIT_SETUP_FAILED = 125


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(self.unix_path)
        self.sock = sock


def fail(message: str) -> None:
    os.write(2, f"tidal-agent: {message}\n".encode())
    os._exit(EXIT_SETUP_FAILED)


def loopback_works() -> bool:
    """Whether a connection to 127.0.0.1 arrives (a down `lo` still binds, never routes)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            with socket.create_connection(server.getsockname(), timeout=2):
                return True
    except OSError:
        return False


def ask_for_loopback(spec: dict) -> None:
    conn = _UnixHTTPConnection(spec["socket"])
    try:
        conn.request(
            "POST",
            f"/v1/sessions/{spec['session_id']}/loopback",
            body=b"",
            headers={"Authorization": f"Bearer {spec['key']}"},
        )
        reply = conn.getresponse()
        body = reply.read()[:300].decode(errors="replace")
    except OSError as exc:
        fail(f"cannot reach the gateway at {spec['socket']}: {exc}")
    if reply.status != 204:
        fail(f"the gateway could not bring up loopback ({reply.status}): {body}")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


def relay_to(path: str):  # type: ignore[no-untyped-def]
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
        )
        up_writer.close()
        writer.close()

    return relay


async def run(spec: dict) -> int:
    server = await asyncio.start_server(relay_to(spec["socket"]), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    env = dict(os.environ, **spec["env"], OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1")
    env["TIDAL_REWARD_URL"] = f"http://127.0.0.1:{port}/v1/sessions/{spec['session_id']}/reward"
    try:
        agent = await asyncio.create_subprocess_exec(*spec["command"], env=env)
    except OSError as exc:
        fail(f"cannot run {spec['command'][0]}: {exc}")
    code = await agent.wait()
    server.close()
    return code if code >= 0 else 128 - code


def main() -> None:
    try:
        with open(SPEC) as f:
            spec = json.load(f)
        os.unlink(SPEC)
    except (OSError, ValueError) as exc:
        fail(f"cannot read {SPEC}: {exc}")
    if not loopback_works():
        ask_for_loopback(spec)
        if not loopback_works():
            fail("127.0.0.1 is still unusable in the sandbox's network namespace")
    sys.exit(asyncio.run(run(spec)))


if __name__ == "__main__":
    main()
