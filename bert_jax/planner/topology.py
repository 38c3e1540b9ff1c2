"""TPU slices by the names users rent them under, as the devices their jobs get.

`parse('v4-8')` -> a `Topology`: the chip grid, the device layout a job on
that slice really gets (v4 and v5p run megacore: one JAX device per chip,
both TensorCores; v5e and v6e chips have one TensorCore; v2 and v3 show each
core as a device), the hosts, and the HBM per device. `devices(topology)`
asks libtpu for compile-only devices of that slice, so a CPU-only host can
compile for it ahead of time (`jax.experimental.topologies`). No TPU is
opened and nothing is allocated.

Every failure is one `TopologyError` line: an unknown name, libtpu not
installed, or a libtpu other than the one the installed jax pins.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
from typing import Optional

from bert_jax.errors import TopologyError

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Generation:
  """One TPU generation: how its slices are named, laid out and what a device holds."""
  name: str  # as users type it: 'v4', 'v5e', 'v5p', 'v6e'
  libtpu_name: str  # libtpu's prefix of a topology: 'v4:2x2x1', 'v5:2x2x1' for v5p
  dims: int  # 3: a 3-D torus of chips (v4, v5p); 2: a 2-D grid
  name_counts: str  # what the number in 'v4-8' counts: 'cores' or 'chips'
  cores_per_chip: int
  megacore: bool  # True: one JAX device per chip (its cores fused)
  hbm_gib_per_chip: float
  max_chips_per_host: int  # chips of a single-host slice (more: hosts of 2x2 chips)

  @property
  def devices_per_chip(self) -> int:
    return 1 if self.megacore else self.cores_per_chip

  @property
  def hbm_bytes_per_device(self) -> int:
    return int(self.hbm_gib_per_chip * GIB) // self.devices_per_chip


GENERATIONS = {g.name: g for g in (
    Generation("v2", "v2", 2, "cores", 2, False, 16, 4),
    Generation("v3", "v3", 2, "cores", 2, False, 32, 4),
    Generation("v4", "v4", 3, "cores", 2, True, 32, 4),
    Generation("v5e", "v5e", 2, "chips", 1, False, 16, 8),
    Generation("v5p", "v5", 3, "cores", 2, True, 95, 4),
    Generation("v6e", "v6e", 2, "chips", 1, False, 32, 8),
    # Ironwood: two TensorCores per chip, each its own JAX device (libtpu 0.0.50's
    # 'tpu7x:2x2x1' has 8 devices for 4 chips), 192 GiB of HBM per chip, a 3-D torus.
    Generation("tpu7x", "tpu7x", 3, "cores", 2, False, 192, 4),
)}
# Other names of a generation (Cloud TPU's API calls v5e 'v5litepod').
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6litepod": "v6e", "v5": "v5p"}
# HBM per JAX device by device_kind, for local devices that do not report it (first match wins).
_HBM_BY_KIND = (("TPU v6", 32), ("TPU v5 lite", 16), ("TPU v5e", 16), ("TPU v5", 95),
                ("TPU v4", 32), ("TPU v3", 32), ("TPU v2", 16))  # GiB per chip

EXAMPLES = "v4-8, v4-32, v5e-8 (or v5litepod-8), v5e-16, v5p-8, v6e-8, tpu7x-8, or v4:2x2x1"


@dataclasses.dataclass(frozen=True)
class Topology:
  """A TPU slice: `generation` chips in a `chips` grid."""
  name: str  # as given
  generation: Generation
  chips: tuple[int, ...]  # the chip grid, e.g. (2, 2, 1)

  @property
  def num_chips(self) -> int:
    n = 1
    for d in self.chips:
      n *= d
    return n

  @property
  def num_devices(self) -> int:
    return self.num_chips * self.generation.devices_per_chip

  @property
  def hbm_bytes_per_device(self) -> int:
    return self.generation.hbm_bytes_per_device

  @property
  def chips_per_host(self) -> tuple[int, int, int]:
    g, grid = self.generation, tuple(self.chips) + (1,) * (3 - len(self.chips))
    if self.num_chips <= g.max_chips_per_host:
      return grid  # a single-host slice (v5litepod-8, v6e-8: 8 chips on one VM)
    return (2, 2, 1)

  @property
  def num_hosts(self) -> int:
    per = 1
    for d in self.chips_per_host:
      per *= d
    return max(1, self.num_chips // per)

  @property
  def libtpu_name(self) -> str:
    return f"{self.generation.libtpu_name}:{'x'.join(map(str, self.chips))}"

  def describe(self) -> str:
    g = self.generation
    per_chip = ("megacore: 1 device per chip" if g.megacore
                else f"{g.devices_per_chip} device{'s' * (g.devices_per_chip > 1)} per chip")
    return (f"{self.name}: {_n(self.num_chips, g.name + ' chip')} ({self.libtpu_name}, "
            f"{per_chip}) = {_n(self.num_devices, 'device')} of "
            f"{self.hbm_bytes_per_device / GIB:g} GiB HBM, {_n(self.num_hosts, 'host')}")

  def topology_kwargs(self) -> dict:
    """Keyword arguments of `jax.experimental.topologies.get_topology_desc`."""
    g = self.generation
    kw = {"chip_config_name": "megacore" if g.megacore else "default",
          "chips_per_host_bounds": self.chips_per_host}
    if g.dims == 3:  # full 4x4x4 cubes and larger are tori (wrap-around links)
      kw["wrap"] = (all(d % 4 == 0 for d in self.chips),) * 3
    elif g.name in ("v5e", "v6e"):  # a 16-chip side wraps around
      kw["wrap"] = tuple(d == 16 for d in self.chips) + (False,)
    return kw


def _n(count: int, noun: str) -> str:
  return f"{count} {noun}{'s' * (count != 1)}"


def _grid(num_chips: int, dims: int) -> Optional[tuple[int, ...]]:
  """The chip grid of a power-of-two slice, as Cloud TPU builds it; None if there is none."""
  if num_chips < 1 or num_chips & (num_chips - 1):
    return None
  if dims == 2:
    if num_chips == 1:
      return (1, 1)
    if num_chips < 4:
      return None
    grid = [2, 2]
    while grid[0] * grid[1] < num_chips:  # 2x2, 2x4, 4x4, 4x8, 8x8, ...
      grid[1 if grid[0] == grid[1] else 0] *= 2
    return tuple(grid)
  if num_chips < 4:
    return None
  grid = [2, 2, 1]
  while grid[0] * grid[1] * grid[2] < num_chips:  # 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, ...
    smaller = [i for i in range(3) if grid[i] < max(grid)]
    grid[smaller[-1] if smaller else 2] *= 2
  return tuple(grid)


def parse(name: str) -> Topology:
  """'v4-8' (a Cloud TPU accelerator type) or 'v4:2x2x1' (libtpu's chip grid) -> Topology."""
  text = name.strip().lower()
  unknown = TopologyError(f"--topology {name!r}: unknown TPU slice; expected a name such as "
                          f"{EXAMPLES}")
  gen = r"(v\d+[a-z]*|tpu\d+[a-z]*)"  # v4, v5e, v6e; tpu7x
  m = re.fullmatch(gen + r"-(\d+)", text) or re.fullmatch(gen + r":(\d+(?:x\d+)+)", text)
  if not m:
    raise unknown
  gen_name = ALIASES.get(m.group(1), m.group(1))
  if ":" in text and m.group(1) == "v5":  # libtpu's 'v5:' is v5p
    gen_name = "v5p"
  g = GENERATIONS.get(gen_name)
  if g is None:
    raise unknown
  if ":" in text:
    chips = tuple(int(d) for d in m.group(2).split("x"))
    if len(chips) != g.dims or min(chips) < 1:
      raise TopologyError(f"--topology {name!r}: a {g.name} slice is a {g.dims}-D grid of "
                          f"chips; expected e.g. {_example(g)}")
    return Topology(name, g, chips)
  count = int(m.group(2))
  per_chip = g.cores_per_chip if g.name_counts == "cores" else 1
  chips = _grid(count // per_chip, g.dims) if count % per_chip == 0 else None
  if chips is None:
    counts = ([1] if g.name_counts == "chips" else []) + [(4 << k) * per_chip for k in range(5)]
    sizes = ", ".join(f"{g.name}-{n}" for n in counts)
    raise TopologyError(f"--topology {name!r}: {g.name} slices are named by their "
                        f"{g.name_counts} ({per_chip} per chip); expected one of {sizes}, ... "
                        f"or a chip grid such as {_example(g)}")
  return Topology(name, g, chips)


def _example(g: Generation) -> str:
  return f"{g.libtpu_name if g.name != 'v5p' else 'v5p'}:" + ("2x2x1" if g.dims == 3 else "2x2")


# ----------------------------------------------------------------------------
# libtpu


def required_libtpu() -> Optional[str]:
  """The libtpu requirement of the installed jax's [tpu] extra, e.g. 'libtpu==0.0.42.*'."""
  try:
    requires = importlib.metadata.requires("jax") or []
  except importlib.metadata.PackageNotFoundError:
    return None
  for req in requires:
    spec, _, marker = req.partition(";")
    if "extra" in marker and '"tpu"' in marker.replace("'", '"'):
      spec = spec.replace(" ", "")
      if re.match(r"libtpu(\W|$)", spec) and not spec.startswith("libtpu-"):
        return spec
  return None


def installed_libtpu() -> Optional[str]:
  """The installed libtpu's version, or None."""
  for dist in ("libtpu", "libtpu-nightly"):
    try:
      return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      continue
  return None


def version_matches(version: str, spec: str) -> bool:
  """Does `version` satisfy `spec` ('libtpu==0.0.42.*', 'libtpu>=0.0.40,<0.0.43')?"""
  spec = re.sub(r"^[A-Za-z0-9_.\-]+", "", spec)
  try:
    from packaging.specifiers import SpecifierSet
    return SpecifierSet(spec).contains(version, prereleases=True)
  except ImportError:  # packaging is not a dependency: the '==X.*' and '==X' forms by hand
    for part in filter(None, spec.split(",")):
      want = part.lstrip("=")
      if not part.startswith("=="):
        return True  # cannot check other operators without packaging: do not refuse
      if want.endswith(".*") and not (version + ".").startswith(want[:-1]):
        return False
      if not want.endswith(".*") and version != want:
        return False
    return True


def check_libtpu(name: str, installed: Optional[str] = None, required: Optional[str] = None,
                 jax_version: Optional[str] = None,
                 library_path: Optional[str] = None) -> None:
  """One TopologyError line if libtpu is missing or not the version this jax pins.

  Arguments default to what is installed (tests pass their own). A libtpu
  given by TPU_LIBRARY_PATH is taken as it is.
  """
  if library_path is None:
    library_path = os.environ.get("TPU_LIBRARY_PATH", "")
  if library_path:
    return
  if jax_version is None:
    import jax
    jax_version = jax.__version__
  installed = installed_libtpu() if installed is None else installed
  required = required_libtpu() if required is None else required
  pin = required or "libtpu"
  if not installed:
    raise TopologyError(
        f"--topology {name}: compiling for a TPU needs libtpu, which is not installed; "
        f"expected {pin} (the version jax {jax_version} pins): pip install '{pin}' "
        f"(or pip install -r requirements-tpu.txt)")
  if required and not version_matches(installed, required):
    raise TopologyError(
        f"--topology {name}: libtpu {installed} does not match jax {jax_version}; expected "
        f"{required}: pip install '{required}'")


def _quiet_env() -> None:
  """On a host that is not a TPU VM, tell libtpu it is alone (no metadata server, no workers).

  Without these libtpu prints errors about TPU_ACCELERATOR_TYPE and
  TPU_WORKER_HOSTNAMES while it loads, and a second process that loads it (two
  plans at once, or a plan beside a run) stops on libtpu's lockfile: only
  compile-only devices are made here, no chip is opened. Values already set
  (a TPU VM's) are kept.
  """
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v4-8")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_WORKER_ID", "0")


def devices(topology: Topology) -> list:
  """Compile-only devices of `topology` (one TopologyError line if that cannot be done)."""
  check_libtpu(topology.name)
  _quiet_env()
  import jax
  from jax._src import xla_bridge
  from jax.experimental import topologies
  if not xla_bridge.backends_are_initialized() and not jax.config.jax_platforms:
    # The host side of an ahead-of-time compile needs only the CPU; JAX would
    # otherwise also try to open this host's (absent or busy) TPU through libtpu.
    jax.config.update("jax_platforms", "cpu")
  try:
    desc = topologies.get_topology_desc(topology.libtpu_name, "tpu",
                                        **topology.topology_kwargs())
  except Exception as e:  # JaxRuntimeError, RuntimeError: libtpu's one-paragraph reasons
    why = " ".join(str(e).split())[:300]
    raise TopologyError(f"--topology {topology.name}: libtpu cannot make {topology.libtpu_name} "
                        f"({why}); expected a slice such as {EXAMPLES}") from None
  devs = list(desc.devices)
  if len(devs) != topology.num_devices:  # the layout this module promises is the one compiled for
    raise TopologyError(f"--topology {topology.name}: libtpu made {len(devs)} devices of "
                        f"{topology.libtpu_name}; expected {topology.num_devices}")
  return devs


def hbm_bytes(device) -> Optional[int]:
  """HBM of one local device: what it reports, else the table by device_kind; None for CPUs."""
  try:
    stats = device.memory_stats() or {}
    if stats.get("bytes_limit"):
      return int(stats["bytes_limit"])
  except Exception:  # compile-only and CPU devices have no memory stats
    pass
  kind = getattr(device, "device_kind", "")
  for prefix, gib in _HBM_BY_KIND:
    if kind.startswith(prefix):
      per_chip = gib * GIB
      # v2/v3 devices are single cores; v4/v5p devices are megacore chips.
      return per_chip // 2 if prefix in ("TPU v3", "TPU v2") else per_chip
  return None


def local_memory_bytes(devices: list) -> tuple[Optional[int], str]:
  """(memory per device, its name) for local devices: HBM, or the host RAM share of CPUs."""
  d = devices[0]
  if d.platform == "cpu":
    try:
      ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
      return None, "RAM"
    return ram // len(devices), "RAM/dev"
  return hbm_bytes(d), "HBM"
