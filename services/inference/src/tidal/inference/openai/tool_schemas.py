"""What the tool-schema worker process runs: each tool's `parameters` must be a JSON
schema of its dialect whose `$ref`s are local (nothing is fetched).

The process (`schema_checks.SchemaChecks`) imports little beyond this module and
jsonschema. The tools cross to it as JSON text and a problem comes back as `(field,
message)`, so neither side pickles nested schemas or exceptions.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from tidal.common.process.launcher_watch import die_with_parent

Problem = tuple[str, str]
"""(the OpenAI field, what is wrong with it)."""


def start_worker(parent: int) -> None:
    """The worker's initializer: it dies with the replica, and a Ctrl-C meant for the
    replica leaves it to be stopped by its pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)


def problem_in_json(tools_json: str) -> Problem | None:
    """`schema_problem` of the tools in `tools_json` (a JSON list of checked tools)."""
    try:
        tools = json.loads(tools_json)
    except RecursionError:
        return "tools", "are nested too deeply"
    return schema_problem(tools)


def schema_problem(tools: Sequence[Mapping[str, Any]]) -> Problem | None:
    """The first tool whose parameters are not a JSON schema with local `$ref`s only
    (`tools[i].function.parameters`), or None when every one is."""
    for i, tool in enumerate(tools):
        parameters = tool["function"].get("parameters", {"type": "object"})
        message = _schema_message(parameters)
        if message is not None:
            return f"tools[{i}].function.parameters", message
    return None


def _schema_message(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return "must be a JSON schema object"
    try:
        validator_for(schema).check_schema(schema)
        refs = list(_refs(schema))
    except SchemaError as e:
        return f"is not a valid JSON schema: {e.message}"
    except RecursionError:
        return "is nested too deeply"
    outside = [r for r in refs if not r.startswith("#")]
    if outside:
        return f"$ref {outside[0][:100]!r}: only local references (#...)"
    return None


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("$ref", "$dynamicRef", "$recursiveRef") and isinstance(item, str):
                yield item
            yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)
