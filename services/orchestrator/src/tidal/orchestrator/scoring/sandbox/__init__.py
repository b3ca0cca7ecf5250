"""Confined execution of untrusted code: tools and code verifiers run here, never in-process."""

from tidal.orchestrator.scoring.sandbox.executor import Sandbox, SandboxResult
from tidal.orchestrator.scoring.sandbox.limits import SandboxLimits

__all__ = ["Sandbox", "SandboxLimits", "SandboxResult"]
