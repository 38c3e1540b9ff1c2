"""Downstream evaluation: tasks (GLUE, plain TSV, TFDS, the shipped word_order probe),
their metrics, and linear probes of a model's features.

tasks.py and metrics.py import no JAX; logreg.py and probe.py do.
"""
