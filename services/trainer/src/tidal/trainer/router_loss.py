"""The MoE router's load-balancing loss as its own term of a micro-batch's loss.

The term comes back as `RouterTerms` beside the loss, never inside the metrics dict:
metrics are detached numbers, the term carries gradient into the router. A model routes
tokens if it has the `RoutedModel` methods (our `DecoderLM`; transformers' wrapper adds
no term). The term is `router_aux_loss_coef × aux_loss` weighted by the micro-batch's
share of the step's loss tokens, so a step adds a token-weighted mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from tidal.models.args import DecoderArgs
from tidal.models.moe import RouterStats


@runtime_checkable
class RoutedModel(Protocol):
    """What a mixture-of-experts model reports about the routing of its last forward."""

    args: DecoderArgs

    def router_stats(self) -> list[RouterStats]: ...

    def aux_loss(self) -> torch.Tensor: ...

    def expert_load(self) -> torch.Tensor: ...


@dataclass(frozen=True)
class RouterTerms:
    loss: torch.Tensor  # () the scaled aux loss, with gradient: added to the step's loss
    metrics: dict[str, torch.Tensor]  # detached parts, summed over the step's micro-batches


def router_terms(model: object, share: float) -> RouterTerms | None:
    """This micro-batch's load-balancing term and load metrics (None for dense models)."""
    if not isinstance(model, RoutedModel) or not model.router_stats():
        return None
    aux = model.aux_loss()  # ()
    load = model.expert_load().detach()  # (L_moe, E)
    experts = load.shape[-1]
    return RouterTerms(
        loss=model.args.router_aux_loss_coef * aux * share,
        metrics={
            "aux_loss": aux.detach() * share,
            # 1.0 = perfectly balanced; E = every slot on one expert.
            "expert_load_max": load.max() * experts * share,
            "expert_load_min": load.min() * experts * share,
        },
    )
