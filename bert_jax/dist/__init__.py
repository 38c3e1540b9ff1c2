"""Devices and processes: mesh and shardings, multi-process start-up and its guards, and
ahead-of-time plans of the steps for TPU topologies."""
