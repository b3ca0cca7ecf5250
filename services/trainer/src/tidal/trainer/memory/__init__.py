"""The memory levers under `[trainer.model]`: their appliers (LoRA, activation offloading,
chunked LM head, truncation, optimizer states off the device; `apply` orders the
model-side ones). Their config is `tidal.trainer.memory_config`; the planner that predicts
their effect is `tidal.trainer.memory_planner`."""
