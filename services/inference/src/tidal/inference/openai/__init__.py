"""The OpenAI-compatible HTTP endpoint of a replica: `server` routes, `body` reads request
bodies, `protocol`, `tools` and `reasoning` map OpenAI fields to domain requests and
choices, `tool_call_stream` splits streamed text into tool calls, and `generate_protocol`
maps vLLM's token-in/token-out generate bodies."""
