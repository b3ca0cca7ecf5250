"""The memory levers under `[trainer.model]`: their config (`config`) and appliers (LoRA,
activation offloading, chunked LM head, truncation; `apply` orders the model-side ones).
The planner that predicts their effect is `tidal.trainer.memory_planner`."""
