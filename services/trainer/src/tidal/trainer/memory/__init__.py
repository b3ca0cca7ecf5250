"""The memory levers under `[trainer.model]`: LoRA, activation offloading, the chunked LM
head, truncation and optimizer states off the device. Their config is `memory_config`,
their order `model_levers`, and `memory_planner` predicts their effect."""
