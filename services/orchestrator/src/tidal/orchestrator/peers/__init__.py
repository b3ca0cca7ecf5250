"""The orchestrator's clients of its peers: inference replicas, the trainer, weightsync's
version feed, and what bounds and delivers the traffic to them."""
