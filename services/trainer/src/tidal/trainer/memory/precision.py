"""What `trainer.precision = "auto"` resolves to, in one place the trainer and the planner read.

torch-free: the memory planner resolves a run's precision from its config without building
the model (only a CPU plan probes the CPU, and that imports torch lazily).
"""

from __future__ import annotations

AUTO_BF16_MIN_PARAMS = 2_000_000
"""`precision = "auto"` keeps fp32 below this many parameters even where bf16 is native:
autocast's per-step weight casts cost more than its matmuls save on tiny models
(docs/benchmarks/trainer_profile.md)."""
