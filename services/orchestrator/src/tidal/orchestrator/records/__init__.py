"""What a run leaves behind and shows: the metrics log, progress for resume, the report and
summary, Prometheus and W&B."""
