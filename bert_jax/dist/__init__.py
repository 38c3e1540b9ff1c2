"""Devices and processes: mesh and shardings, multi-process start-up and its guards."""
