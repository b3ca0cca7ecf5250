"""`--fit`: the cheapest combination of memory levers whose predicted peak fits a budget.

An exhaustive search (at most 72 combinations, each priced by `plan_memory`) over what
can help on the device and what the trainer accepts (`candidates`, each rule naming the
check it mirrors). Cost is the product of each lever's estimated step-time factor; ties
go to the lower peak. LoRA, compile and the optimizer stay as the config sets them.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from tidal.models.args import DecoderArgs
from tidal.trainer.memory_planner.estimate import MemoryPlan, Workload, plan_memory
from tidal.trainer.memory_planner.levers import Levers

STEP_TIME_FACTOR = {
    "chunked LM head": 1.03,
    "ac selective": 1.12,
    "ac full": 1.30,
    "activation offloading": 1.10,
    "optimizer offload (cpu)": 1.05,
    "optimizer offload (disk)": 1.25,
    "FSDP CPU offload": 1.60,
}


@dataclass(frozen=True)
class Fit:
    levers: Levers
    plan: MemoryPlan
    cost: float  # predicted step time relative to no lever
    reasons: list[str]


def _cost(levers: Levers) -> tuple[float, list[str]]:
    factors = []
    if levers.lm_head_chunk is not None:
        factors.append("chunked LM head")
    if levers.ac_mode != "none":
        factors.append(f"ac {levers.ac_mode}")
    if levers.ac_offloading:
        factors.append("activation offloading")
    if levers.optim_offload != "none":
        factors.append(f"optimizer offload ({levers.optim_offload})")
    if levers.fsdp_cpu_offload:
        factors.append("FSDP CPU offload")
    cost = 1.0
    for name in factors:
        cost *= STEP_TIME_FACTOR[name]
    return cost, [f"{name}: ×{STEP_TIME_FACTOR[name]:.2f} step time" for name in factors]


def candidates(base: Levers, w: Workload) -> list[Levers]:
    """Every lever combination the trainer accepts and that can help on `w`'s device and
    world size, keeping LoRA, compile and the optimizer as `base` (the config) sets them."""
    on_gpu = w.device == "cuda"  # host offloads save nothing on a CPU run
    # A table lever the config sets stays on: the answer is an overlay, which cannot unset.
    ac_modes = ("selective", "full") if base.ac_mode != "none" else ("none", "selective", "full")
    offloading = (True,) if base.ac_offloading else (False, True) if on_gpu else (False,)
    chunks = (None,) if base.impl == "hf" else (None, "auto")  # check_lever_combination
    optims = ("none", "cpu", "disk") if on_gpu else ("none", "disk")
    # FSDP exists only with more than one rank: check_levers_at_start refuses it at one.
    fsdp_offloads = (False, True) if on_gpu and w.world_size > 1 else (False,)
    out = []
    for ac, chunk, offload, optim, fsdp in itertools.product(
        ac_modes, chunks, offloading, optims, fsdp_offloads
    ):
        if fsdp and optim != "none":
            continue  # TrainerConfig refuses it: FSDP offload already covers optimizer states
        out.append(
            dataclasses.replace(
                base,
                ac_mode=ac,
                ac_freq=1,
                ac_targets=("norm", "mlp"),
                lm_head_chunk=chunk,
                ac_offloading=offload,
                optim_offload=optim,
                fsdp_cpu_offload=fsdp,
            )
        )
    return out


def fit(a: DecoderArgs, base: Levers, w: Workload, budget: float) -> Fit | None:
    """The cheapest combination whose predicted peak is at most `budget` bytes, or None."""
    best: Fit | None = None
    for levers in candidates(base, w):
        plan = plan_memory(a, levers, w)
        if plan.peak > budget:
            continue
        cost, reasons = _cost(levers)
        if best is None or (cost, plan.peak) < (best.cost, best.plan.peak):
            best = Fit(levers, plan, cost, reasons)
    return best
