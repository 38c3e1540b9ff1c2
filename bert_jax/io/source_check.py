"""A continued run's source, checked whole before anything is prepared or made.

`init_from.resolve` reads the source's config and vocabulary; `check_weights`
then reads everything else a run will need from it at step 0, without loading
a tensor's data, so that a damaged or mismatched source is refused before any
data is prepared or any folder made (not after, leaving files behind):

  - safetensors (one file, or every shard of model.safetensors.index.json):
    the header's length and JSON, every tensor's dtype, shape and byte range
    [begin, end) against the file's size (contiguous from 0 to the end, as the
    reader requires), so a file cut short is named with what it lacks;
  - pytorch_model.bin: its zip directory, every member's byte range against the
    file size, then the tensors' shapes (memory-mapped, data not read);
  - a google-research TensorFlow checkpoint: the .index file and every
    .data-NNNNN-of-MMMMM shard it names, and with TensorFlow the variables'
    shapes and bytes against the shards' sizes;
  - bert-jax sources (read whole by `resolve`): each parameter's shape against
    the model_config of the checkpoint's meta;

and then every tensor's name and shape against the source's config
(`hf_weights.match_hf_names`, the check `hf_state_to_params` makes when the
weights are loaded). A problem is one ConvertError line naming the file.
"""

from __future__ import annotations

import glob
import json
import os
import re
import struct
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from bert_jax.io import sources
from bert_jax.io.hf_weights import (ConvertError, abstract_params_of, get_path, match_hf_names,
                                 tf_to_hf)
from bert_jax.model import family
from bert_jax.settings.model import ModelConfig
from bert_jax.storage import fs

# safetensors dtypes that bert_jax.io.convert's reader (safetensors.numpy) loads, with their sizes.
SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "I64": 8, "U64": 8, "I32": 4, "U32": 4,
                      "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "C64": 8}
_MAX_HEADER = 100_000_000  # the safetensors reader's own limit on the header's length
_AGAIN = "expected the complete file (copy or download it again)"


def safetensors_shapes(path: str) -> dict[str, tuple]:
  """{tensor name: shape} of a safetensors file, every header entry checked against its size."""
  header, n, size = _safetensors_header(path)
  data_size = size - 8 - n
  shapes, ranges = {}, []
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    shape, begin, end = _tensor_entry(f"{path}: tensor {name!r}", entry)
    if end > data_size:
      raise ConvertError(f"{path}: cut short: tensor {name!r} ends at byte {8 + n + end} but "
                         f"the file has {size} bytes; {_AGAIN}")
    shapes[name] = shape
    ranges.append((begin, end, name))
  at = 0
  for begin, end, name in sorted(ranges):
    if begin != at:
      raise ConvertError(f"{path}: tensor {name!r} starts at data byte {begin}, expected {at} "
                         "(tensors must follow each other without gaps or overlaps); " + _AGAIN)
    at = end
  if at != data_size:
    raise ConvertError(f"{path}: {data_size - at} bytes after the last tensor; expected the "
                       "file to end where its last tensor ends")
  return shapes


def _safetensors_header(path: str) -> tuple[dict, int, int]:
  """(header object, header bytes n, file size): one message per way the header is damaged."""
  try:
    size = os.path.getsize(path)
    with fs.open(path, "rb") as f:
      head = f.read(8)
      n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
      text = f.read(n) if n is not None and n <= _MAX_HEADER else b""
  except OSError as e:
    raise ConvertError(f"{path}: cannot read ({e.strerror})") from None
  if n is None:
    raise ConvertError(f"{path}: {size} bytes, too short for a safetensors header; {_AGAIN}")
  if n > _MAX_HEADER:
    raise ConvertError(f"{path}: not a safetensors file (its first 8 bytes give a header of "
                       f"{n} bytes); expected a model.safetensors")
  if len(text) < n:
    raise ConvertError(f"{path}: cut short: its header needs {8 + n} bytes but the file has "
                       f"{size}; {_AGAIN}")
  try:
    header = json.loads(text.decode("utf-8"))
  except (UnicodeDecodeError, ValueError) as e:
    raise ConvertError(f"{path}: the safetensors header is not valid JSON "
                       f"({str(e).splitlines()[0]}); {_AGAIN}") from None
  if not isinstance(header, dict):
    raise ConvertError(f"{path}: the safetensors header is a {type(header).__name__}; "
                       "expected a JSON object of tensors")
  return header, n, size


def _tensor_entry(where: str, entry: Any) -> tuple[tuple, int, int]:
  """(shape, begin, end) of one header entry, its dtype and byte count checked."""
  try:
    dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
    shape = tuple(int(d) for d in shape)
    begin, end = int(begin), int(end)
  except (KeyError, TypeError, ValueError):
    raise ConvertError(f"{where}: its header entry {json.dumps(entry)[:200]} lacks dtype, "
                       "shape or data_offsets [begin, end]; " + _AGAIN) from None
  if dtype not in SAFETENSORS_DTYPES:
    raise ConvertError(f"{where} has dtype {dtype!r}, which bert-jax cannot read from "
                       f"safetensors; expected one of {', '.join(SAFETENSORS_DTYPES)} "
                       "(e.g. save it as float32)")
  want = int(np.prod(shape, dtype=np.int64)) * SAFETENSORS_DTYPES[dtype]
  if min(shape, default=0) < 0 or begin < 0 or end - begin != want:
    raise ConvertError(f"{where}: its header gives bytes [{begin}, {end}) for a {dtype} "
                       f"tensor of shape {shape} ({want} bytes); {_AGAIN}")
  return shape, begin, end


def _safetensors_index_shapes(index: str) -> dict[str, tuple]:
  weight_map = sources.read_json(index, "safetensors index").get("weight_map")
  if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
    raise ConvertError(f"{index}: expected a 'weight_map' object of tensor name -> shard file")
  shapes: dict[str, tuple] = {}
  directory = os.path.dirname(index)
  for shard in sorted(set(weight_map.values())):
    path = os.path.join(directory, shard)
    if not os.path.isfile(path):
      raise ConvertError(f"{index}: its shard {path} does not exist; expected every file its "
                         "weight_map names")
    shapes.update(safetensors_shapes(path))
  return shapes


def torch_bin_shapes(path: str) -> dict[str, tuple]:
  """{name: shape} of a pytorch_model.bin: zip members against the file size, then the
  shapes through a memory map (no tensor data read). A pre-zip (torch < 1.6) file is
  only opened later, when the run loads it."""
  try:
    size = os.path.getsize(path)
    with zipfile.ZipFile(path) as z:
      for info in z.infolist():
        # A member's local header is 30 bytes plus its name and extra field.
        if info.header_offset + 30 + len(info.filename) + info.compress_size > size:
          raise ConvertError(f"{path}: cut short: member {info.filename!r} ends past the "
                             f"file's {size} bytes; {_AGAIN}")
  except zipfile.BadZipFile as e:
    with fs.open(path, "rb") as f:
      if f.read(2) == b"\x80\x02":  # a legacy pickle, not a zip: nothing cheap to check
        return {}
    raise ConvertError(f"{path}: not a complete torch zip file ({e}); {_AGAIN}") from None
  except OSError as e:
    raise ConvertError(f"{path}: cannot read ({e.strerror})") from None
  try:
    import torch  # pylint: disable=import-outside-toplevel  (optional: only for .bin)
  except ImportError:
    raise ConvertError(f"{path}: reading pytorch_model.bin needs torch (pip install torch); "
                       "or convert it to model.safetensors") from None
  try:
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
  except Exception as e:  # pylint: disable=broad-except  (pickle/zip errors come in many types)
    raise ConvertError(f"{path}: cannot read as a weights-only torch state dict "
                       f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
  if not isinstance(state, Mapping):
    raise ConvertError(f"{path}: expected a state dict, got {type(state).__name__}")
  return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def _tf_variables(prefix: str) -> dict[str, tuple[tuple, int]]:
  """{variable: (shape, bytes)} from the checkpoint's index, with TensorFlow."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel  (optional)
  reader = tf.train.load_checkpoint(prefix)
  dtypes = reader.get_variable_to_dtype_map()
  return {name: (tuple(shape), int(np.prod(shape, dtype=np.int64)) * dtypes[name].size)
          for name, shape in reader.get_variable_to_shape_map().items()}


def tensorflow_shapes(directory: str) -> dict[str, tuple]:
  """HF-named {tensor: shape} of a TF checkpoint: its index and every data shard present,
  the variables' bytes within the shards' sizes."""
  prefix = sources.tf_checkpoint_prefix(directory)
  index = prefix + ".index"
  if os.path.getsize(index) == 0:
    raise ConvertError(f"{index}: empty; {_AGAIN}")
  shards = glob.glob(glob.escape(prefix) + ".data-*-of-*")
  counts = {int(m.group(1)) for s in shards if (m := re.search(r"-of-(\d+)$", s))}
  if len(counts) != 1:
    raise ConvertError(f"{prefix}: no data shard (expected {os.path.basename(prefix)}.data-"
                       "00000-of-00001 beside the .index)" if not counts else
                       f"{prefix}: data shards of different counts {sorted(counts)}; expected "
                       "one checkpoint's shards")
  total = counts.pop()
  names = [f"{prefix}.data-{i:05d}-of-{total:05d}" for i in range(total)]
  missing = [n for n in names if not os.path.isfile(n)]
  if missing:
    raise ConvertError(f"{missing[0]}: no such file; expected all {total} data shards of the "
                       "checkpoint")
  try:
    variables = _tf_variables(prefix)
  except Exception as e:  # pylint: disable=broad-except  (TF raises its own error types)
    raise ConvertError(f"{index}: cannot read the TensorFlow checkpoint index "
                       f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                       + _AGAIN) from None
  have, need = sum(os.path.getsize(n) for n in names), sum(b for _, b in variables.values())
  if need > have:
    raise ConvertError(f"{prefix}: cut short: its variables need {need} bytes but its data "
                       f"shards have {have}; {_AGAIN}")
  # Shapes as HF names: tf_to_hf renames and transposes; zero-stride arrays cost nothing.
  fake = {n: np.broadcast_to(np.float32(0), s) for n, (s, _) in variables.items()}
  return {n: tuple(np.shape(x)) for n, x in tf_to_hf(fake).items()}


def check_params(params: Any, config: ModelConfig, where: str) -> None:
  """A bert-jax source's parameter tree has every parameter of `config`'s family (its
  encoder and pre-training heads), each in its shape."""
  import jax  # pylint: disable=import-outside-toplevel
  abstract = abstract_params_of(config)
  tree = family.of(config).hf_pretraining
  for key_path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
    path = tuple(str(getattr(k, "key", k)) for k in key_path)
    try:
      got = tuple(np.shape(get_path(params, path)))
    except (KeyError, TypeError):
      raise ConvertError(f"{where}: params have no {'/'.join(path)}; expected a {tree} "
                         f"parameter tree (the checkpoint meta's model family is "
                         f"{config.family!r})") from None
    want = tuple(leaf.shape)
    if got != want:
      raise ConvertError(f"{where}: param {'/'.join(path)} has shape {got}; its meta's "
                         f"model_config expects {want}")


def check_weights(path: str, kind: str, config: ModelConfig) -> str:
  """Checks a HuggingFace or TensorFlow source's weights (see the module doc); returns
  the weights file or prefix that was checked."""
  if kind == "tensorflow":
    where = sources.tf_checkpoint_prefix(path)
    shapes = tensorflow_shapes(path)
  else:
    single, index, torch_bin = (os.path.join(path, n) for n in (
        "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"))
    if os.path.isfile(single):  # the order sources.load_hf_weights reads them in
      where, shapes = single, safetensors_shapes(single)
    elif os.path.isfile(index):
      where, shapes = index, _safetensors_index_shapes(index)
    elif os.path.isfile(torch_bin):
      where, shapes = torch_bin, torch_bin_shapes(torch_bin)
      if not shapes:
        return where  # a legacy pickle: checked when loaded
    else:
      raise ConvertError(f"{path}: no weights (expected model.safetensors, "
                         "model.safetensors.index.json or pytorch_model.bin)")
  match_hf_names(shapes, config, source=where, heads=True)
  return where
