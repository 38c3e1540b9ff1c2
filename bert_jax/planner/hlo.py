"""What a compiled step does, read from its optimized HLO text (`compiled.as_text()`).

The collectives of one step (kind, how often they run, bytes), the operand
and result dtypes of every matmul, and anything that talks to the host.
Pure text processing: it imports no JAX, so it reads HLO from any backend.

Counts are per execution of the step: an op inside a loop body counts once
per iteration when XLA knows the trip count (`known_trip_count`), else once.
XLA TPU hides some collectives in fusions: a reduce-scatter is a kCustom
fusion calling an `all-reduce-scatter` computation (counted as one
reduce-scatter; its inner all-reduce is not counted again), async
collectives sit inside `async_collective_fusion` computations (counted where
they are), and TPU7x's SparseCore runs all-reduces in computations an async
`call-start` names (counted there).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Iterator, Optional

_BYTES = {"pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2,
          "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
          "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?(%?[\w.\-]+)\s*=\s*(.*)$")
_HEADER = re.compile(r"^(ENTRY\s+)?(%?[\w.\-]+)\s*\(.*\{\s*$")
_CALLS = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation|"
                    r"branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')

# Ops whose `to_apply` is a computation that runs (not a reducer): TPU7x's libtpu offloads
# the gradient all-reduces to the SparseCore as `call-start(), to_apply=%c` on its own
# execution thread, the all-reduce inside %c (BERT-Base's 440 MB of them).
_CALL_OPS = ("call", "call-start")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")
# Ops that move data between the device and the host inside a step.
HOST_OPCODES = ("send", "recv", "send-done", "recv-done", "infeed", "outfeed")
_HOST_CALL_TARGET = re.compile(r"callback|host|py_func", re.I)


@dataclasses.dataclass
class Instr:
  name: str
  type_text: str  # 'f32[8,128]{1,0:T(8,128)}' or a tuple '(f32[..], bf16[..])'
  opcode: str
  operands: list  # names
  attrs: str  # everything after the operand list
  computation: str
  args: str = ""  # the operand list as written ('4' for constant(4))


@dataclasses.dataclass
class Module:
  computations: dict  # name -> [Instr]
  entry: str
  defs: dict  # instruction name -> Instr (names are unique in a module)
  roots: dict = dataclasses.field(default_factory=dict)  # computation -> its ROOT Instr


def _balanced(text: str, start: int) -> int:
  """Index just past the parenthesis that closes the one at `start`."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] == "(":
      depth += 1
    elif text[i] == ")":
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def _bare(name: str) -> str:
  return name.lstrip("%")


def parse(text: str) -> Module:
  """The computations and instructions of an HLO module's text."""
  comps, defs, roots, entry, current = {}, {}, {}, "", None
  for line in text.splitlines():
    if not line.startswith((" ", "\t")):
      header = _HEADER.match(line)
      if header:
        current = _bare(header.group(2))
        comps[current] = []
        if header.group(1):
          entry = current
      elif line.rstrip() == "}":  # not "}}, metadata=...": a multi-line attribute's
        current = None            # continuation (a Mosaic kernel's backend_config)
      continue
    m = _INSTR.match(line)
    if not m or current is None:
      continue
    name, rest = _bare(m.group(1)), m.group(2)
    if rest.startswith("("):
      end = _balanced(rest, 0)
      type_text, rest = rest[:end], rest[end:].lstrip()
    else:
      type_text, _, rest = rest.partition(" ")
    op = re.match(r"([\w\-]+)\(", rest)
    if not op:
      continue
    end = _balanced(rest, op.end() - 1)
    operands = [_bare(x) for x in re.findall(r"%[\w.\-]+", rest[op.end():end - 1])]
    instr = Instr(name, type_text, op.group(1), operands, rest[end:], current,
                  rest[op.end():end - 1])
    comps[current].append(instr)
    defs[name] = instr
    if line.lstrip().startswith("ROOT "):
      roots[current] = instr
  return Module(comps, entry, defs, roots)


def bytes_by_dtype(type_text: str) -> collections.Counter:
  """Bytes of an array or tuple type per element type (layout annotations ignored)."""
  out = collections.Counter()
  for dtype, dims in _ARRAY.findall(re.sub(r"\{[^}]*\}", "", type_text)):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    out[dtype] += int(n * _BYTES.get(dtype, 4))
  return out


def array_bytes(type_text: str) -> int:
  """Bytes of an array or tuple type (layout annotations ignored)."""
  return sum(bytes_by_dtype(type_text).values())


def dtype_of(type_text: str) -> str:
  m = _ARRAY.search(type_text)
  return m.group(1) if m else "?"


def _trip_count(module: Module, loop: Instr) -> Optional[int]:
  """Iterations of a while loop: XLA's known_trip_count, or a condition `i < N` (i from 0)."""
  known = _TRIP.search(loop.attrs)
  if known:
    return int(known.group(1))
  cond = re.search(r"\bcondition=%?([\w.\-]+)", loop.attrs)
  root = module.roots.get(cond.group(1)) if cond else None
  if root is not None and root.opcode == "compare" and "direction=LT" in root.attrs:
    bound = module.defs.get(root.operands[-1]) if len(root.operands) == 2 else None
    if bound is not None and bound.opcode == "constant" and re.fullmatch(r"\d+", bound.args):
      return int(bound.args)
  return None


def multiplicities(module: Module) -> tuple[dict, set]:
  """(times each computation runs per step, computations inside loops of unknown trip count)."""
  edges = collections.defaultdict(list)  # caller -> [(callee, factor, known)]
  for comp, instrs in module.computations.items():
    for ins in instrs:
      for kind, target in _CALLS.findall(ins.attrs):
        if kind == "condition" or (kind == "to_apply" and ins.opcode not in _CALL_OPS):
          continue  # reducers and loop conditions hold no collectives worth counting
        trip = _trip_count(module, ins) if kind == "body" else 1
        for callee in re.findall(r"%?([\w.\-]+)", target.strip("{}")):
          edges[comp].append((callee, trip or 1, trip is not None))
  mult, unknown = collections.Counter(), set()
  order, seen = [], set()

  def visit(c):  # post-order: callees after every caller in the reversed list
    if c in seen:
      return
    seen.add(c)
    for callee, _, _ in edges.get(c, ()):
      visit(callee)
    order.append(c)

  visit(module.entry)
  mult[module.entry] = 1
  for c in reversed(order):
    for callee, factor, known in edges.get(c, ()):
      mult[callee] += mult[c] * factor
      if not known or c in unknown:
        unknown.add(callee)
  return dict(mult), unknown


@dataclasses.dataclass
class Collective:
  kind: str  # 'all-reduce', 'all-gather', 'reduce-scatter', ...
  count: int  # executions per step
  bytes: int  # per device per step: the full array of each (result; the input for reduce-scatter)
  in_unknown_loop: bool = False  # some ran in a loop whose trip count XLA did not state
  dtypes: dict = dataclasses.field(default_factory=dict)  # element type -> its share of bytes

  @property
  def float_bytes(self) -> int:
    """Bytes of floating-point data (parameters, gradients, activations), not indices."""
    return sum(n for t, n in self.dtypes.items() if t.startswith(("f", "bf")))

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def collectives(text_or_module) -> list[Collective]:
  """The collectives of one step, by kind (sorted by bytes, largest first)."""
  module = parse(text_or_module) if isinstance(text_or_module, str) else text_or_module
  mult, unknown = multiplicities(module)
  scatter_comps = {c for c in module.computations if c.startswith("all-reduce-scatter")}
  out: dict = {}
  for comp, instrs in module.computations.items():
    n = mult.get(comp, 0)
    if not n or comp in scatter_comps:
      continue
    for ins in instrs:
      kind, types = None, None
      called = re.search(r"\bcalls=%?([\w.\-]+)", ins.attrs)
      if ins.opcode == "fusion" and called and called.group(1) in scatter_comps:
        kind, types = "reduce-scatter", _operand_types(module, ins)
      elif ins.opcode.endswith("-done"):
        continue  # its -start was counted
      else:
        base = ins.opcode[:-len("-start")] if ins.opcode.endswith("-start") else ins.opcode
        if base in COLLECTIVES:
          kind, types = base, bytes_by_dtype(ins.type_text)
          if ins.opcode.endswith("-start") and ins.type_text.startswith("("):
            # (operand, result[, scratch]) tuples: count the data once
            types = collections.Counter({t: n // 2 for t, n in types.items()})
          if base == "reduce-scatter":
            types = _operand_types(module, ins) or types
      if kind:
        c = out.setdefault(kind, Collective(kind, 0, 0))
        c.count += n
        c.bytes += n * sum(types.values())
        for t, b in types.items():
          c.dtypes[t] = c.dtypes.get(t, 0) + n * b
        c.in_unknown_loop |= comp in unknown
  return sorted(out.values(), key=lambda c: -c.bytes)


def _operand_types(module: Module, ins: Instr) -> collections.Counter:
  out = collections.Counter()
  for o in ins.operands:
    if o in module.defs:
      out.update(bytes_by_dtype(module.defs[o].type_text))
  return out


def dots(text_or_module) -> list[tuple[str, str, str, str]]:
  """(lhs dtype, rhs dtype, result dtype, op name) of every dot and convolution (TPUs run
  matmuls as convolutions)."""
  module = parse(text_or_module) if isinstance(text_or_module, str) else text_or_module
  out = []
  for instrs in module.computations.values():
    for ins in instrs:
      if ins.opcode in ("dot", "convolution") and len(ins.operands) >= 2:
        lhs, rhs = (module.defs.get(o) for o in ins.operands[:2])
        where = re.search(r'op_name="([^"]*)"', ins.attrs)
        out.append((dtype_of(lhs.type_text) if lhs else "?", dtype_of(rhs.type_text) if rhs
                    else "?", dtype_of(ins.type_text), where.group(1) if where else ins.name))
  return out


def host_transfers(text_or_module) -> list[str]:
  """Ops of a step that call back into or exchange data with the host ('' list: none)."""
  module = parse(text_or_module) if isinstance(text_or_module, str) else text_or_module
  out = []
  for instrs in module.computations.values():
    for ins in instrs:
      target = _call_target(ins)
      if (ins.opcode in HOST_OPCODES or "is_host_transfer=true" in ins.attrs
          or (ins.opcode == "custom-call" and target and _HOST_CALL_TARGET.search(target))):
        out.append(f"{ins.opcode} {ins.name}" + (f" ({target})" if target else ""))
  return out


def custom_call_targets(text_or_module) -> collections.Counter:
  """How many custom calls of each target a step has ('tpu_custom_call': a compiled Mosaic
  kernel, such as splash attention's forward and backward)."""
  module = parse(text_or_module) if isinstance(text_or_module, str) else text_or_module
  targets = (_call_target(ins) for ins in iter_instrs(module) if ins.opcode == "custom-call")
  return collections.Counter(t for t in targets if t)


def _call_target(ins: Instr) -> str:
  """The custom_call_target of an instruction ('' when it has none)."""
  m = re.search(r'custom_call_target="([^"]*)"', ins.attrs)
  return m.group(1) if m else ""


def iter_instrs(module: Module) -> Iterator[Instr]:
  for instrs in module.computations.values():
    yield from instrs


def opcode_counts(module: Module, opcodes: Optional[tuple] = None) -> collections.Counter:
  return collections.Counter(i.opcode for i in iter_instrs(module)
                             if opcodes is None or i.opcode in opcodes)
