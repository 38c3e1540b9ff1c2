"""A continued run's source is checked whole before any data is prepared or folder made.

The source is a random BERT (hidden 32, 1 layer) written as a HuggingFace
directory from numpy (no transformers needed); each test damages a copy.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bert_jax import default_config
from bert_jax.io import source_check
from bert_jax.io import checkpointing, convert
from bert_jax.commands import convert as convert_cli
from bert_jax.train import init_from
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.io.hf_weights import hf_config_from_bert, tensor_spec
from bert_jax.settings.model import ModelConfig
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.trainer import train_and_evaluate
import soak_kill

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "data", "corpus.txt")


def toy_texts():
  with open(TOY, encoding="utf-8") as f:
    return [part for line in f for part in line.strip().split("\t") if part]


def write_source(path: str) -> str:
  """A random BertForPreTraining as a HuggingFace directory: config.json,
  model.safetensors, vocab.txt."""
  tok = Tokenizer.train(toy_texts(), 200, lowercase=True)
  config = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=1, num_heads=2,
                      intermediate_size=64, max_position_embeddings=64, vocab_pad_multiple=1,
                      dtype="float32")
  rng = np.random.default_rng(0)
  state = {t.hf: rng.normal(0, 0.02, t.hf_shape).astype(np.float32) for t in tensor_spec(config)}
  os.makedirs(path, exist_ok=True)
  save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
    json.dump(hf_config_from_bert(config), f)
  tok.save(path)
  os.remove(os.path.join(path, "tokenizer_config.json"))
  return path


# A small continued run (no model shape fields: the source decides them).
RUN_FIELDS = {"data.corpus": TOY, "data.dupe_factor": 1, "data.max_eval_examples": 64,
              "model.dtype": "float32", "train.batch_size": 16, "train.num_steps": 2,
              "train.warmup_steps": 1, "train.phase_fractions": (1.0,), "train.seq_lens": (32,),
              "train.max_predictions": (5,), "log_every": 2, "eval_every": 2,
              "checkpoint_every": 2, "eval_batches": 1, "progress_bar": False,
              "compile_cache_dir": ""}


def run_config(source: str, cache: str):
  c = default_config.get_config()
  c.update_from_flattened_dict({**RUN_FIELDS, "init_from": source, "data.cache_dir": cache})
  return c


@pytest.fixture(scope="module")
def good(tmp_path_factory):
  return write_source(str(tmp_path_factory.mktemp("source") / "hf"))


def _copy(good, tmp_path) -> str:
  out = str(tmp_path / "src")
  shutil.copytree(good, out)
  return out


def _rewrite_header(path: str, change) -> None:
  """Rewrites a safetensors file's header JSON with `change(header)`; the data stays."""
  with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header, data = json.loads(f.read(n)), f.read()
  change(header)
  text = json.dumps(header).encode()
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)


def _last_tensor(header) -> str:
  return max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])


def truncate_half(d):
  path = os.path.join(d, "model.safetensors")
  os.truncate(path, os.path.getsize(path) // 2)
  return "model.safetensors", "cut short"


def header_claims_more_bytes(d):
  def grow(header):
    last = header[_last_tensor(header)]
    last["shape"] = [last["shape"][0] + 8] + last["shape"][1:]
    rows = int(np.prod(last["shape"][1:], dtype=np.int64))
    last["data_offsets"][1] += 8 * rows * 4
  _rewrite_header(os.path.join(d, "model.safetensors"), grow)
  return "model.safetensors", "cut short: tensor"


def header_length_past_the_end(d):
  path = os.path.join(d, "model.safetensors")
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.write(struct.pack("<Q", size))  # a header as long as the whole file
  return "model.safetensors", "cut short: its header needs"


def header_not_json(d):
  path = os.path.join(d, "model.safetensors")
  with open(path, "r+b") as f:
    f.seek(8)
    f.write(b"\xff{[")
  return "model.safetensors", "not valid JSON"


def trailing_bytes(d):
  with open(os.path.join(d, "model.safetensors"), "ab") as f:
    f.write(b"\0" * 16)
  return "model.safetensors", "16 bytes after the last tensor"


def wrong_shape(d):
  path = os.path.join(d, "model.safetensors")
  state = load_file(path)
  state["bert.encoder.layer.0.intermediate.dense.weight"] = np.zeros((48, 32), np.float32)
  save_file(state, path, metadata={"format": "pt"})
  return "model.safetensors", "intermediate.dense.weight' has shape (48, 32)"


def bf16_tensor(d):
  def to_bf16(header):
    name = _last_tensor(header)
    header[name]["dtype"] = "BF16"
    header[name]["shape"] = header[name]["shape"] + [2]  # the same bytes as 2 x bf16
  _rewrite_header(os.path.join(d, "model.safetensors"), to_bf16)
  return "model.safetensors", "dtype 'BF16'"


def config_not_json(d):
  with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
    f.write('{"vocab_size": 2')
  return "config.json", "not valid JSON"


def vocab_not_text(d):
  with open(os.path.join(d, "vocab.txt"), "wb") as f:
    f.write(b"\xff\xfe\x00[PAD]\n")
  return "vocab.txt", "is not UTF-8"


def missing_shard(d):
  path = os.path.join(d, "model.safetensors")
  state = load_file(path)
  names = sorted(state)
  half = len(names) // 2
  for i, part in enumerate((names[:half], names[half:])):
    save_file({k: state[k] for k in part}, os.path.join(d, f"model-0000{i + 1}-of-00002.safetensors"),
              metadata={"format": "pt"})
  with open(os.path.join(d, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
    json.dump({"weight_map": {k: f"model-0000{1 + (i >= half)}-of-00002.safetensors"
                              for i, k in enumerate(names)}}, f)
  os.remove(path)
  os.remove(os.path.join(d, "model-00002-of-00002.safetensors"))
  return "model.safetensors.index.json", "model-00002-of-00002.safetensors does not exist"


def truncated_shard(d):
  missing_shard(d)
  state = load_file(os.path.join(d, "model-00001-of-00002.safetensors"))
  path = os.path.join(d, "model-00002-of-00002.safetensors")
  save_file(state, path, metadata={"format": "pt"})
  os.truncate(path, os.path.getsize(path) - 100)
  return "model-00002-of-00002.safetensors", "cut short"


def truncated_torch_bin(d):
  torch = pytest.importorskip("torch")
  path = os.path.join(d, "model.safetensors")
  state = {k: torch.from_numpy(v) for k, v in load_file(path).items()}
  os.remove(path)
  bin_path = os.path.join(d, "pytorch_model.bin")
  torch.save(state, bin_path)
  os.truncate(bin_path, os.path.getsize(bin_path) - 1000)
  return "pytorch_model.bin", "not a complete torch zip file"


DAMAGE = [truncate_half, header_claims_more_bytes, header_length_past_the_end, header_not_json,
          trailing_bytes, wrong_shape, bf16_tensor, config_not_json, vocab_not_text,
          missing_shard, truncated_shard, truncated_torch_bin]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_a_damaged_source_is_one_line_before_anything_is_written(good, tmp_path, damage):
  src = _copy(good, tmp_path)
  file_name, match = damage(src)
  workdir, cache = tmp_path / "run", tmp_path / "cache"
  before = set(os.listdir(tmp_path))
  with pytest.raises(ConfigError) as e:
    train_and_evaluate(run_config(src, str(cache)), str(workdir))
  message = str(e.value)
  assert "\n" not in message and file_name in message and match in message, message
  assert message.startswith(f"--config.init_from='{src}'"), message
  assert set(os.listdir(tmp_path)) == before  # no workdir, no cache folder, nothing else


def test_the_checks_pass_a_good_source_and_agree_with_the_reader(good):
  path = os.path.join(good, "model.safetensors")
  shapes = source_check.safetensors_shapes(path)
  assert shapes == {k: v.shape for k, v in load_file(path).items()}
  source = init_from._read_hf_like(good, "huggingface")  # pylint: disable=protected-access
  assert source_check.check_weights(good, "huggingface", source.config) == path


def test_a_legacy_pickle_torch_bin_is_left_to_the_loader(good, tmp_path):
  torch = pytest.importorskip("torch")
  src = _copy(good, tmp_path)
  state = {k: torch.from_numpy(v) for k, v in load_file(os.path.join(src, "model.safetensors")).items()}
  os.remove(os.path.join(src, "model.safetensors"))
  zipped = os.path.join(src, "pytorch_model.bin")
  torch.save(state, zipped)
  assert zipfile.is_zipfile(zipped)
  assert source_check.torch_bin_shapes(zipped) == {k: tuple(v.shape) for k, v in state.items()}
  torch.save(state, zipped, _use_new_zipfile_serialization=False)
  assert source_check.torch_bin_shapes(zipped) == {}


def test_a_bert_jax_source_whose_params_do_not_match_its_meta_is_refused(good, tmp_path):
  ckpt = str(tmp_path / "converted")
  assert convert_cli.main(["from-hf", good, ckpt]) == 0
  params, meta = checkpointing.restore_params(ckpt)
  meta = {**meta, "model_config": {**meta["model_config"], "intermediate_size": 48}}
  bad = str(tmp_path / "bad")
  checkpointing.save_params(bad, 0, params, meta)
  with pytest.raises(BertJaxError, match=r"intermediate/bias has shape \(64,\); its meta"):
    train_and_evaluate(run_config(bad, str(tmp_path / "cache")), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_tensorflow_shards_and_sizes_are_checked(tmp_path, monkeypatch):
  """Without TensorFlow here: the reader of the index is replaced by its answer."""
  d = tmp_path / "tf"
  d.mkdir()
  (d / "bert_model.ckpt.index").write_bytes(b"index")
  (d / "bert_model.ckpt.data-00000-of-00002").write_bytes(b"\0" * 64)
  monkeypatch.setattr(source_check, "_tf_variables",
                      lambda prefix: {"bert/pooler/dense/kernel": ((4, 4), 64)})
  with pytest.raises(BertJaxError, match=r"data-00001-of-00002: no such file"):
    source_check.tensorflow_shapes(str(d))
  (d / "bert_model.ckpt.data-00001-of-00002").write_bytes(b"")
  monkeypatch.setattr(source_check, "_tf_variables",
                      lambda prefix: {"bert/pooler/dense/kernel": ((4, 8), 128)})
  with pytest.raises(BertJaxError, match="need 128 bytes but its data shards have 64"):
    source_check.tensorflow_shapes(str(d))
  monkeypatch.setattr(source_check, "_tf_variables",
                      lambda prefix: {"bert/pooler/dense/kernel": ((4, 8), 64)})
  assert source_check.tensorflow_shapes(str(d)) == {"bert.pooler.dense.weight": (8, 4)}


@pytest.mark.slow
def test_train_py_refuses_a_truncated_source_with_exit_2_and_writes_nothing(good, tmp_path):
  src = _copy(good, tmp_path)
  truncate_half(src)
  workdir, cache = tmp_path / "run", tmp_path / "cache"
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"), "--config",
       os.path.join(ROOT, "bert_jax", "default_config.py"), "--workdir", str(workdir),
       f"--config.init_from={src}", f"--config.data.cache_dir={cache}",
       *(f"--config.{k}={v}" for k, v in RUN_FIELDS.items())],
      capture_output=True, text=True, timeout=300, env=soak_kill.subprocess_env())
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
  assert os.path.join(src, "model.safetensors") in errors[0] and "cut short" in errors[0]
  assert "Traceback" not in proc.stderr
  assert not workdir.exists() and not cache.exists()
