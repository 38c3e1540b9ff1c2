"""bert-jax: BERT pre-training (MLM + NSP) on JAX/Flax, and feature extraction."""

import glob
import importlib.util
import os
import sys
from typing import Optional

from bert_jax.storage import fs

__version__ = "0.2.0"

# Device files of an accelerator JAX could open: TPU chips (v4: /dev/accel*; v5e, v5p, v6e:
# VFIO groups), NVIDIA and AMD GPUs.
_ACCELERATOR_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*", "/dev/kfd")
_GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips on the PCI bus, as jax itself looks for them


def has_accelerator(patterns: tuple = _ACCELERATOR_FILES,
                    pci_vendors: str = "/sys/bus/pci/devices/*/vendor") -> bool:
  """Does this host have a TPU or GPU device that JAX could open?"""
  if any(glob.glob(p) for p in patterns):
    return True
  for path in glob.glob(pci_vendors):
    try:
      with fs.open(path) as f:
        if f.read().strip() == _GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return False


def cpu_only_without_accelerator(environ=os.environ, accelerator: Optional[bool] = None) -> bool:
  """On a CPU-only host with libtpu installed, pins JAX to the CPU; returns whether it did.

  JAX tries libtpu's TPU backend first wherever libtpu is installed, and on a
  host without a TPU libtpu prints errors about TPU_ACCELERATOR_TYPE and
  TPU_WORKER_HOSTNAMES before JAX falls back to the CPU. The CPU is the only
  platform such a host has, so pinning it changes nothing else. Left as they
  are: a JAX_PLATFORMS (or JAX_FORCE_TPU_INIT) the user set, hosts without
  libtpu, and hosts with a TPU or GPU device (TPU VMs keep libtpu's start-up).
  """
  if "JAX_PLATFORMS" in environ or "JAX_FORCE_TPU_INIT" in environ:
    return False
  if importlib.util.find_spec("libtpu") is None and not environ.get("TPU_LIBRARY_PATH"):
    return False
  if has_accelerator() if accelerator is None else accelerator:
    return False
  environ["JAX_PLATFORMS"] = "cpu"  # read when jax is imported
  jax = sys.modules.get("jax")
  if jax is not None and not jax.config.jax_platforms:  # imported already, not yet set
    jax.config.update("jax_platforms", "cpu")
  return True

