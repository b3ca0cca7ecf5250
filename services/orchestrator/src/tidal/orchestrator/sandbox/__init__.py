"""Confined execution of untrusted code: tools and code verifiers run here, never in-process."""

from tidal.orchestrator.sandbox.executor import Sandbox, SandboxResult
from tidal.orchestrator.sandbox.limits import SandboxLimits

__all__ = ["Sandbox", "SandboxLimits", "SandboxResult"]
