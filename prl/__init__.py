"""prl: production-RL data pipelines."""
