"""Distributed-run planning: TPU topologies and ahead-of-time plans of the train and eval steps."""
