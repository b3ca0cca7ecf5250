"""The session gateway: agent programs call an OpenAI chat endpoint with a key per episode,
and what the policy saw and sampled is recorded token for token (docs/agents.md)."""
