"""Plain values as JSON lines: what crosses between a code task's tests and the sandboxed program.

Only data crosses: None, bools, numbers, strings, bytes and lists, tuples, sets, dicts of
them. The program's objects never reach the trusted side (an object whose `__eq__`
always says yes cannot be returned), and nothing of the trusted side reaches the program.
Scalars are JSON's own; every container is a two-item JSON list `[tag, items]`, so a
decoded value has exactly the type that was encoded. Standard library only: the harness
runs this module's source inside the sandbox, where nothing else is importable.
"""

import json

MAX_DEPTH = 64


def encode(value, depth=0):
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value) in (int, float):
        return value
    if type(value) is complex:
        return ["complex", [value.real, value.imag]]
    if type(value) is bytes:
        return ["bytes", value.hex()]
    if type(value) in (list, tuple, set, frozenset):
        return [type(value).__name__, [encode(v, depth + 1) for v in value]]
    if type(value) is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"{type(value).__name__} is not a plain value")


def decode(data, depth=0):
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    tag, items = data
    if tag == "complex":
        return complex(*items)
    if tag == "bytes":
        return bytes.fromhex(items)
    if tag == "dict":
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in items}
    kinds = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
    return kinds[tag](decode(v, depth + 1) for v in items)


def dumps(message):
    return json.dumps(message, separators=(",", ":")) + "\n"
