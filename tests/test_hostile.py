"""Hostile input: one table of bad inputs to data preparation, training, checkpoint
import and feature extraction, each held to the same contract.

Fatal input: exit code 2; stderr ends with exactly one `error: ...` line that names
the input (file or field) and says what was expected; no traceback; nothing is
written and nothing already there changes (the case's folder and the shared
prepared data, checkpoint and HF export hash the same before and after).
Odd input: exit 0; one `warning: ...` line with the count; the output is made;
nothing already there changes.

How each case runs: `train.py` in a subprocess where flag parsing or the CLI
itself is the point; `trainer.train_and_evaluate`, `dataset.prepare`,
`convert.main` and `features_cli.main` in this process otherwise (a BertJaxError
becomes `error: ...` and 2 exactly as train.py does), which keeps the table fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import tiny_run
import os
import re
import shutil
import stat
import subprocess
import sys
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import settings
from bert_jax.data import dataset
from bert_jax.commands import features as features_cli
from bert_jax.io import checkpointing, convert
from bert_jax.commands import convert as convert_cli
from bert_jax.errors import BertJaxError
from bert_jax.model.build import abstract_params
from bert_jax.data.tokenizer import SPECIAL_TOKENS
from bert_jax.trainer import train_and_evaluate
from configs import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "data", "corpus.txt")
WORDS = ("the cat dog sat on a mat and ran to house tree bird sang river flows past old "
         "stone bridge under grey sky rain fell all day long").split()
VOCAB = list(SPECIAL_TOKENS) + WORDS + ["##s", ".", ","]
SEQ_LEN = 64  # tiny.py's
# An error says what was expected in one of these words.
EXPECTATION = re.compile(r"\b(expected|expects|need|needs|must|use|pass)\b")


# ----------------------------------------------------------------------------
# The shared world: a vocabulary, prepared data, a previous run, an HF export


@dataclasses.dataclass
class World:
  vocab: str  # vocab.txt of VOCAB
  cache: str  # data.cache_dir holding the prepared toy corpus
  run: str  # workdir of a previous run: checkpoints/7 (training layout) + metrics.jsonl
  hf: str  # the run exported by `convert to-hf`

  @property
  def shared(self) -> list[str]:
    return [self.vocab, self.cache, self.run, self.hf]

  def base(self) -> dict[str, Any]:
    """Config overrides every training case starts from: tiny model, shared data."""
    return {**tiny_run.BASE, "data.vocab_file": self.vocab, "data.cache_dir": self.cache,
            "data.dupe_factor": 1, "train.num_steps": 8}


def _config(overrides: dict[str, Any]):
  c = tiny.get_config()
  for key, value in overrides.items():
    *parents, name = key.split(".")
    node = c
    for p in parents:
      node = node[p]
    node[name] = value
  return c


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
  root = tmp_path_factory.mktemp("hostile_world")
  vocab = _text(root / "vocab.txt", "".join(t + "\n" for t in VOCAB))
  w = World(vocab=vocab, cache=str(root / "cache"), run=str(root / "run"), hf=str(root / "hf"))
  c = _config(w.base())
  dataset.prepare(settings.data_settings(c), [SEQ_LEN], w.cache, c.seed)
  # A checkpoint as a training run writes it, from the same config (random values
  # drawn on the host: compiling an init costs more than this whole table).
  bert_config = settings.from_config(c).model_config(len(VOCAB))
  boxed = abstract_params(bert_config)
  rs = np.random.RandomState(0)
  params = jax.tree.map(lambda x: rs.normal(0, 0.2, x.shape).astype(np.float32),
                        nn.meta.unbox(boxed))
  mngr = checkpointing.manager(os.path.join(w.run, "checkpoints"), async_save=False)
  checkpointing.save(mngr, 7, params, {"opt_state": {"count": jnp.int32(7)},
                                       "rng": jax.random.key_data(jax.random.key(0))},
                     {"model_config": bert_config.to_dict(), "vocab": VOCAB, "lowercase": True,
                      "seed": 0, "config": {}, "step": 7, "phase": 0, "data_position": 3})
  mngr.wait_until_finished()
  mngr.close()
  _text(os.path.join(w.run, "metrics.jsonl"), '{"split": "train", "step": 7, "loss": 9.0}\n')
  with contextlib.redirect_stdout(io.StringIO()):
    assert convert_cli.main(["to-hf", w.run, w.hf]) == 0
  return w


# ----------------------------------------------------------------------------
# Running a case


@dataclasses.dataclass
class Call:
  tool: str  # "train.py" (subprocess) | "train" | "prepare" | "convert" | "features"
  args: Any  # argv, or config overrides for "train"/"prepare"
  workdir: str = ""  # for "train.py" and "train"


@dataclasses.dataclass
class Result:
  rc: int
  stderr: str
  value: Any = None  # what an in-process call returned


@dataclasses.dataclass(frozen=True)
class Case:
  id: str
  area: str  # data | train | import | features
  make: Callable[[Any, World], Call]  # (case folder, world) -> the call; writes the inputs
  names: str  # the input the message must name (a file name or a config field)
  says: tuple[str, ...]  # what the message must also say (for odd input: the count)
  kind: str = "fatal"  # or "odd"
  produced: Optional[Callable[[Result, Call], None]] = None  # odd: the output is there


def _train_argv(w: World, call: Call) -> list[str]:
  """The case's flags after the base overrides (the last value wins); --config= first."""
  first = [a for a in call.args if a.startswith("--config=")]
  return first + [f"--workdir={call.workdir}"] + [
      f"--config.{k}={v}" for k, v in w.base().items()] + [
          a for a in call.args if a not in first]


def _run(call: Call, w: World) -> Result:
  if call.tool == "train.py":
    argv = _train_argv(w, call)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    return Result(proc.returncode, proc.stderr)
  err, value = io.StringIO(), None
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    try:  # what train.py's main does with the same call
      if call.tool == "train":
        value = train_and_evaluate(_config({**w.base(), **call.args}), call.workdir)
        rc = 0
      elif call.tool == "prepare":
        c = _config({**w.base(), **call.args})
        value = dataset.prepare(settings.data_settings(c), [SEQ_LEN],
                                c.data.cache_dir, c.seed)
        rc = 0
      elif call.tool == "convert":
        rc = convert_cli.main(call.args)
      else:
        rc = features_cli.main(call.args)
    except BertJaxError as e:
      print(f"error: {e}", file=sys.stderr)
      rc = 2
  return Result(rc, err.getvalue(), value)


def _digest(path: str) -> str:
  st = os.lstat(path)
  if stat.S_ISLNK(st.st_mode):
    return "link -> " + os.readlink(path)
  if stat.S_ISDIR(st.st_mode):
    return "dir"
  if not stat.S_ISREG(st.st_mode):
    return f"special {stat.S_IFMT(st.st_mode)}"  # a pipe is never opened
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def _snapshot(*roots: str) -> dict[str, str]:
  """path -> content hash of every file, folder and link under `roots` (links not followed)."""
  out = {}
  for root in roots:
    if not os.path.lexists(root):
      continue
    out[root] = _digest(root)
    for d, dirs, files in os.walk(root):
      for name in dirs + files:
        out[os.path.join(d, name)] = _digest(os.path.join(d, name))
  return out


# ----------------------------------------------------------------------------
# Inputs


def _text(path, text: str) -> str:
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return str(path)


def _bytes(path, data: bytes) -> str:
  with open(path, "wb") as f:
    f.write(data)
  return str(path)


def _sentence(rs: np.random.RandomState) -> str:
  return " ".join(rs.choice(WORDS, size=rs.randint(4, 12))) + " ."


def _documents(n: int = 8, sentences: int = 3, seed: int = 0, single: int = 0) -> list[list[str]]:
  """`n` plain-format documents; the first `single` of them have one sentence."""
  rs = np.random.RandomState(seed)
  return [[_sentence(rs) for _ in range(1 if i < single else sentences)] for i in range(n)]


def _plain(docs: list[list[str]]) -> str:
  return "\n\n".join("\n".join(d) for d in docs) + "\n"


def _mkdir(path) -> str:
  os.makedirs(path)
  return str(path)


def _loop(d) -> str:
  os.symlink(str(d / "loop_b.txt"), str(d / "loop_a.txt"))
  os.symlink(str(d / "loop_a.txt"), str(d / "loop_b.txt"))
  return str(d / "loop_a.txt")


def _fifo(d) -> str:
  os.mkfifo(str(d / "pipe.txt"))
  return str(d / "pipe.txt")


def _copy_run(w: World, d) -> str:
  shutil.copytree(w.run, str(d / "run"), symlinks=True)
  return str(d / "run")


def _hf_copy(w: World, d, edit: Callable[[str], None] = lambda p: None) -> str:
  dst = str(d / "hf_model")
  shutil.copytree(w.hf, dst)
  edit(dst)
  return dst


def _edit_json(path: str, **fields) -> None:
  with open(path, encoding="utf-8") as f:
    obj = json.load(f)
  _text(path, json.dumps({**obj, **fields}))


def _imported(w: World, d) -> str:
  """A previous import in the case folder: what a failing --overwrite must keep."""
  out = str(d / "imported")
  with contextlib.redirect_stdout(io.StringIO()):
    assert convert_cli.main(["from-hf", w.hf, out]) == 0
  return out


def _features(w: World, d, *extra: str, text: str = "the cat sat\n", inp: str = "",
              checkpoint: str = "", output: str = "features.npy") -> list[str]:
  """features argv; a previous features.npy already sits where failures would write."""
  np.save(str(d / "features.npy"), np.arange(6, dtype=np.float32).reshape(2, 1, 3))
  return ["--checkpoint", checkpoint or w.run, "--input", inp or _text(d / "in.txt", text),
          "--output", str(d / output), *extra]


# --- what odd input must still produce ---


def _prepared(stat_key: str, count: int):
  def check(res: Result, call: Call) -> None:
    prepared = res.value
    for f in ("settings.json", "stats.json", "tokenizer/vocab.txt", f"seq{SEQ_LEN}/info.json"):
      assert os.path.isfile(os.path.join(prepared.directory, f)), f
    assert len(prepared.train[SEQ_LEN]) > 0 and len(prepared.eval[SEQ_LEN]) > 0
    with open(os.path.join(prepared.directory, "stats.json"), encoding="utf-8") as f:
      stats = json.load(f)
    got = stats[stat_key] if stat_key in stats else stats["repaired"][stat_key]["count"]
    assert got == count, stats
  return check


def _rows(n: int):
  def check(res: Result, call: Call) -> None:
    out = call.args[call.args.index("--output") + 1]
    assert np.load(out).shape[0] == n
  return check


# ----------------------------------------------------------------------------
# The table


PLAIN = _plain(_documents())
LONG_LINE = ("the cat sat on a mat . " * ((10 << 20) // 23 + 1))[:10 << 20]

CASES = [
    # --- data preparation ---
    Case("data-missing-file", "data", lambda d, w: Call(
        "train.py", [f"--config.data.corpus={d / 'missing.txt'}"], str(d / "w")),
       "missing.txt", ("does not exist",)),
    Case("data-directory-not-file", "data", lambda d, w: Call(
        "train", {"data.corpus": _mkdir(d / "corpus_dir")}, str(d / "w")),
       "corpus_dir", ("holds no files",)),
    Case("data-symlink-loop", "data", lambda d, w: Call(
        "train.py", [f"--config.data.corpus={_loop(d)}"], str(d / "w")),
       "loop_a.txt", ("loop",)),
    Case("data-glob-matches-nothing", "data", lambda d, w: Call(
        "train", {"data.corpus": str(d / "shards" / "*.txt")}, str(d / "w")),
       "shards/*.txt", ("matches no files",)),
    Case("data-empty-file", "data", lambda d, w: Call(
        "train", {"data.corpus": _text(d / "empty.txt", "")}, str(d / "w")),
       "empty.txt", ("no text",)),
    Case("data-only-blank-lines", "data", lambda d, w: Call(
        "train", {"data.corpus": _text(d / "blank.txt", "\n  \n\t\n\n")}, str(d / "w")),
       "blank.txt", ("blank lines",)),
    Case("data-truncated-gzip-file", "data", lambda d, w: Call(
        "train", {"data.corpus": _bytes(d / "corpus.txt.gz",
                                        gzip.compress(PLAIN.encode() * 50)[:-40])},
        str(d / "w")),
       "corpus.txt.gz", ("gzip", "truncated")),
    Case("data-utf16-file", "data", lambda d, w: Call(
        "train", {"data.corpus": _bytes(d / "utf16.txt", PLAIN.encode("utf-16"))}, str(d / "w")),
       "utf16.txt", ("UTF-16", "UTF-8")),
    Case("data-binary-file", "data", lambda d, w: Call(
        "train", {"data.corpus": _bytes(d / "model.bin", np.random.RandomState(0).randint(
            0, 256, 5000).astype(np.uint8).tobytes())}, str(d / "w")),
       "model.bin", ("UTF-8",)),
    Case("data-pipe", "data", lambda d, w: Call("train", {"data.corpus": _fifo(d)}, str(d / "w")),
       "pipe.txt", ("not a regular file",)),
    Case("data-one-sentence-corpus", "data", lambda d, w: Call(
        "train", {"data.corpus": _text(d / "one.txt", "A single sentence.\n")}, str(d / "w")),
       "one.txt", ("too small", "at least 4 documents")),
    Case("data-tab-format-without-tabs", "data", lambda d, w: Call(
        "train", {"data.corpus": _text(d / "plain.txt", PLAIN), "data.format": "tab"},
        str(d / "w")),
       "plain.txt", ("TAB", "format=plain")),
    Case("data-unknown-format", "data", lambda d, w: Call(
        "train", {"data.format": "xml"}, str(d / "w")),
       "data.format", ("auto, plain, tab",)),
    Case("data-vocab-duplicates", "data", lambda d, w: Call(
        "train", {"data.vocab_file": _text(d / "dup_vocab.txt",
                                           "\n".join(VOCAB + ["cat"]) + "\n")}, str(d / "w")),
       "dup_vocab.txt", ("repeats token 'cat'", f"line {len(VOCAB) + 1}")),
    Case("data-vocab-without-mask", "data", lambda d, w: Call(
        "train", {"data.vocab_file": _text(d / "nomask_vocab.txt", "\n".join(
            t for t in VOCAB if t != "[MASK]") + "\n")}, str(d / "w")),
       "nomask_vocab.txt", ("[MASK]",)),
    Case("data-vocab-is-directory", "data", lambda d, w: Call(
        "train", {"data.vocab_file": _mkdir(d / "vocab_dir")}, str(d / "w")),
       "vocab_dir", ("data.vocab_file", "is a directory")),
    Case("data-vocab-not-utf8", "data", lambda d, w: Call(
        "train", {"data.vocab_file": _bytes(d / "latin1_vocab.txt", "\n".join(
            VOCAB + ["caf\xe9"]).encode("latin-1"))}, str(d / "w")),
       "latin1_vocab.txt", ("UTF-8",)),
    Case("data-invalid-utf8-bytes", "data", lambda d, w: Call("prepare", {"data.corpus": _bytes(
        d / "bad_bytes.txt", PLAIN.encode() + b"\nthe c\xffat sat .\nthe m\xfeat \xfdran .\n")}),
       "bad_bytes.txt", ("3 byte sequence(s) that are not UTF-8",), "odd",
       _prepared("invalid_utf8", 3)),
    Case("data-nul-and-control-chars", "data", lambda d, w: Call("prepare", {"data.corpus": _text(
        d / "control.txt", PLAIN + "\nt\x00he cat sat .\nthe d\x00og r\x1ban .\n")}),
       "control.txt", ("3 control character(s)",), "odd", _prepared("control_chars", 3)),
    Case("data-10mb-single-line", "data", lambda d, w: Call("prepare", {"data.corpus": _text(
        d / "long_line.txt", LONG_LINE + "\n\n" + PLAIN)}),
       "long_line.txt", ("1 line(s) over 1 MiB",), "odd", _prepared("long_lines", 1)),
    Case("data-one-sentence-documents", "data", lambda d, w: Call("prepare", {"data.corpus": _text(
        d / "short_docs.txt", _plain(_documents(n=8, single=3)))}),
       "short_docs.txt", ("3 of 8 document(s)",), "odd", _prepared("one_sentence_documents", 3)),
    Case("data-tab-lines-without-one-tab", "data", lambda d, w: Call("prepare", {
        "data.format": "tab", "data.corpus": _text(d / "pairs.txt", "".join(
            f"{a}\t{b}\n" for a, b in _documents(n=10, sentences=2)) + "x\ty\tz\nno tab\n")}),
       "pairs.txt", ("2 tab-format line(s)",), "odd", _prepared("tab_lines_skipped", 2)),

    # --- training config ---
    Case("train-override-of-wrong-type", "train", lambda d, w: Call(
        "train.py", ["--config.train.batch_size=abc"], str(d / "w")),
       "config.train.batch_size", ("expected an integer",)),
    Case("train-override-of-unknown-field", "train", lambda d, w: Call(
        "train.py", ["--config.train.batch_sise=32"], str(d / "w")),
       "config.train.batch_sise", ("'batch_size'",)),
    Case("train-missing-config-file", "train", lambda d, w: Call(
        "train.py", [f"--config={d / 'nope.py'}"], str(d / "w")),
       "nope.py", ("config file",)),
    Case("train-zero-batch", "train", lambda d, w: Call(
        "train.py", ["--config.train.batch_size=0"], _copy_run(w, d)),
       "config.train.batch_size=0", ("> 0",)),
    Case("train-negative-batch", "train", lambda d, w: Call(
        "train", {"train.batch_size": -16}, _copy_run(w, d)),
       "config.train.batch_size=-16", ("> 0",)),
    Case("train-negative-steps", "train", lambda d, w: Call(
        "train", {"train.num_steps": -5}, _copy_run(w, d)),
       "config.train.num_steps=-5", ("positive",)),
    Case("train-zero-hidden-size", "train", lambda d, w: Call(
        "train", {"model.hidden_size": 0}, _copy_run(w, d)),
       "config.model.hidden_size=0", ("positive",)),
    Case("train-heads-not-dividing-hidden", "train", lambda d, w: Call(
        "train", {"model.num_heads": 3}, _copy_run(w, d)),
       "config.model.num_heads=3", ("hidden_size=32",)),
    Case("train-seq-len-above-positions", "train", lambda d, w: Call(
        "train", {"train.seq_lens": (256,), "train.max_predictions": (20,)}, _copy_run(w, d)),
       "config.train.seq_lens[0]=256", ("max_position_embeddings=128",)),
    Case("train-seq-lens-not-integers", "train", lambda d, w: Call(
        "train", {"train.seq_lens": ("abc",)}, _copy_run(w, d)),
       "config.train.seq_lens", ("integers",)),
    Case("train-unknown-dtype", "train", lambda d, w: Call(
        "train", {"model.dtype": "float8"}, _copy_run(w, d)),
       "config.model.dtype", ("float32",)),
    Case("train-batch-not-divisible-by-devices", "train", lambda d, w: Call(
        "train", {"train.batch_size": 12}, _copy_run(w, d)),
       "config.train.batch_size=12", ("multiple of 8",)),
    Case("train-phase-fractions-not-summing-to-1", "train", lambda d, w: Call(
        "train", {"train.phase_fractions": (0.5, 0.6), "train.seq_lens": (32, 64),
                  "train.max_predictions": (5, 10)}, _copy_run(w, d)),
       "config.train.phase_fractions", ("summing to 1",)),
    Case("train-negative-learning-rate", "train", lambda d, w: Call(
        "train", {"train.learning_rate": -1e-3}, _copy_run(w, d)),
       "config.train.learning_rate", ("> 0",)),
    Case("train-mask-prob-above-1", "train", lambda d, w: Call(
        "train", {"masking.mask_prob": 1.5}, _copy_run(w, d)),
       "config.masking.mask_prob", ("0 < p < 1",)),
    Case("train-workdir-is-a-file", "train", lambda d, w: Call(
        "train.py", [], _text(d / "workdir.txt", "notes\n")),
       "workdir.txt", ("not a directory",)),
    Case("train-resume-with-another-model-size", "train", lambda d, w: Call(
        "train.py", ["--config.model.hidden_size=64"], _copy_run(w, d)),
       "hidden_size=32", ("64",)),

    # --- checkpoint import / export ---
    Case("import-missing-directory", "import", lambda d, w: Call(
        "convert", ["from-hf", str(d / "no_model"), str(d / "out")]),
       "no_model", ("no such directory",)),
    Case("import-source-is-a-file", "import", lambda d, w: Call(
        "convert", ["from-hf", os.path.join(w.hf, "config.json"), str(d / "out")]),
       "config.json", ("not a directory",)),
    Case("import-source-symlink-loop", "import", lambda d, w: Call(
        "convert", ["from-hf", _loop(d), str(d / "out")]),
       "loop_a.txt", ("directory",)),
    Case("import-missing-config-json", "import", lambda d, w: Call("convert", [
        "from-hf", _hf_copy(w, d, lambda p: os.remove(os.path.join(p, "config.json"))),
        str(d / "out")]),
       "config.json", ("no such file",)),
    Case("import-config-not-json", "import", lambda d, w: Call("convert", [
        "from-hf", _hf_copy(w, d, lambda p: _text(os.path.join(p, "config.json"), "{oops")),
        str(d / "out")]),
       "config.json", ("not valid JSON",)),
    Case("import-weights-of-another-size", "import", lambda d, w: Call("convert", [
        "from-hf", _hf_copy(w, d, lambda p: _edit_json(os.path.join(p, "config.json"),
                                                       hidden_size=64)),
        _imported(w, d), "--overwrite"]),
       "model.safetensors", ("has shape", "the config expects")),
    Case("import-vocab-of-another-length", "import", lambda d, w: Call("convert", [
        "from-hf", _hf_copy(w, d, lambda p: _text(os.path.join(p, "vocab.txt"), "".join(
            t + "\n" for t in VOCAB[:-1]))), str(d / "out")]),
       "vocab.txt", (f"vocab_size={len(VOCAB)}",)),
    Case("import-output-not-empty", "import", lambda d, w: Call(
        "convert", ["from-hf", w.hf, _imported(w, d)]),
       "imported", ("--overwrite",)),
    Case("export-missing-step", "import", lambda d, w: Call(
        "convert", ["to-hf", w.run, str(d / "out"), "--step", "99"]),
       "step 99", ("have [7]",)),
    Case("export-output-is-a-file", "import", lambda d, w: Call(
        "convert", ["to-hf", w.run, _text(d / "out.txt", "x\n")]),
       "out.txt", ("not a directory",)),

    # --- feature extraction ---
    Case("features-empty-input", "features", lambda d, w: Call(
        "features", _features(w, d, text="")),
       "in.txt", ("empty",)),
    Case("features-only-blank-lines", "features", lambda d, w: Call(
        "features", _features(w, d, text="\n \n\n")),
       "in.txt", ("only blank lines",)),
    Case("features-input-is-a-directory", "features", lambda d, w: Call(
        "features", _features(w, d, inp=_mkdir(d / "inputs_dir"))),
       "inputs_dir", ("is a directory",)),
    Case("features-non-utf8-input", "features", lambda d, w: Call(
        "features", _features(w, d, inp=_bytes(d / "latin1.txt", b"ok\ncaf\xe9\n"))),
       "latin1.txt", ("line 2",)),
    Case("features-layer-out-of-range", "features", lambda d, w: Call(
        "features", _features(w, d, "--layers", "-1,5")),
       "layers: 5", ("-3..2",)),
    Case("features-checkpoint-of-another-size", "features", lambda d, w: Call(
        "features", _features(w, d, "--expect_config", "hidden_size=768")),
       "hidden_size=32", ("768",)),
    Case("features-missing-checkpoint", "features", lambda d, w: Call(
        "features", _features(w, d, checkpoint=str(d / "no_run"))),
       "no_run", ("no such directory",)),
    Case("features-checkpoint-without-steps", "features", lambda d, w: Call(
        "features", _features(w, d, checkpoint=_mkdir(d / "empty_run"))),
       "empty_run", ("no step",)),
    Case("features-checkpoint-is-a-file", "features", lambda d, w: Call(
        "features", _features(w, d, checkpoint=_text(d / "ckpt.txt", "x"))),
       "ckpt.txt", ("checkpoint directory",)),
    Case("features-per-token-into-npy", "features", lambda d, w: Call(
        "features", _features(w, d, "--pooling", "none")),
       "features.npy", (".npz",)),
    Case("features-max-length-above-positions", "features", lambda d, w: Call(
        "features", _features(w, d, "--max_length", "129")),
       "max_length=129", ("max_position_embeddings=128",)),
    Case("features-blank-lines", "features", lambda d, w: Call(
        "features", _features(w, d, text="the cat\n\nsat\n\n", output="new.npy")),
       "in.txt", ("2 blank line(s)",), "odd", _rows(4)),
    Case("features-long-inputs-truncated", "features", lambda d, w: Call(
        "features", _features(w, d, "--max_length", "16", output="new.npy",
                              text="the cat\n" + "a dog ran " * 20 + "\n" + "sat " * 30 + "\n")),
       "max_length=16", ("2 of 3 inputs",), "odd", _rows(3)),

    # --- issue 12: params-only readers, imported NaN (helpers at the end of the file) ---
    Case("features-newest-checkpoint-without-params", "features", lambda d, w: Call(
        "features", _features(w, d, checkpoint=_run_with_damaged_step(w, d), output="new.npy")),
       "checkpoints/9 (", ("using step 7",), "odd", _rows(1)),
    Case("features-given-step-with-bad-meta", "features", lambda d, w: Call(
        "features", _features(w, d, "--step", "9",
                              checkpoint=_run_with_damaged_step(w, d, "meta"))),
       "checkpoints/9", ("incomplete or unreadable", "JSONDecodeError")),
    Case("export-newest-checkpoint-with-bad-meta", "import", lambda d, w: Call(
        "convert", ["to-hf", _run_with_damaged_step(w, d, "meta"), str(d / "out")]),
       "checkpoints/9 (", ("using step 7",), "odd",
       lambda r, c: _exported(r, c)),
    Case("export-given-step-without-params", "import", lambda d, w: Call(
        "convert", ["to-hf", _run_with_damaged_step(w, d), str(d / "out"), "--step", "9"]),
       "checkpoints/9", ("incomplete or unreadable",)),
    Case("import-weights-with-nan-and-inf", "import", lambda d, w: Call("convert", [
        "from-hf", _hf_copy(w, d, _poison_weights), str(d / "out")]),
       "model.safetensors", ("2 tensor(s)", "bert.embeddings.LayerNorm.bias",
                             "cls.seq_relationship.bias"), "odd",
       lambda r, c: _imported_ok(r, c)),
    Case("train-resume-with-another-vocabulary", "train", lambda d, w: Call(
        "train", _other_vocabulary(w, d), _copy_run(w, d)),
       "holds a run with another vocabulary", ("first difference at id", "--workdir")),
]


def test_the_table_covers_every_area_with_enough_cases():
  ids = [c.id for c in CASES]
  assert len(set(ids)) == len(ids)
  counts = {a: sum(c.area == a for c in CASES) for a in ("data", "train", "import", "features")}
  assert len(CASES) >= 30 and counts["data"] >= 10 and counts["train"] >= 8, counts
  assert counts["import"] >= 5 and counts["features"] >= 5, counts


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, world: World, tmp_path):
  call = case.make(tmp_path, world)
  watched = [str(tmp_path), *world.shared]
  before = _snapshot(*watched)
  res = _run(call, world)
  after = _snapshot(*watched)
  assert "Traceback" not in res.stderr, res.stderr
  lines = [l for l in res.stderr.splitlines() if l.strip()]
  if case.kind == "fatal":
    assert res.rc == 2, res.stderr
    errors = [l for l in lines if l.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], res.stderr
    msg = errors[0]
    assert case.names in msg, msg
    for s in case.says:
      assert s in msg, msg
    assert EXPECTATION.search(msg), f"says nothing of what was expected: {msg}"
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert not changed, f"written or changed by a failed run: {changed}"
  else:
    assert res.rc == 0, res.stderr
    assert not [l for l in lines if l.startswith("error:")], res.stderr
    hits = [l for l in lines if all(s in l for s in (case.names, *case.says))]
    assert len(hits) == 1 and hits[0].startswith("warning:"), res.stderr
    changed = sorted(p for p in before if before[p] != after.get(p))
    assert not changed, f"damaged by a run on odd input: {changed}"
    case.produced(res, call)


# ----------------------------------------------------------------------------
# Helpers of the issue-12 rows (looked up when a case runs)


def _run_with_damaged_step(w: World, d, damage: str = "params") -> str:
  """A copy of the run whose newest step 9 (a copy of step 7) lacks its params
  ("params") or has a meta that is not JSON ("meta")."""
  run = _copy_run(w, d)
  ckpts = os.path.join(run, "checkpoints")
  shutil.copytree(os.path.join(ckpts, "7"), os.path.join(ckpts, "9"))
  if damage == "params":
    shutil.rmtree(os.path.join(ckpts, "9", "params"))
  else:
    _text(os.path.join(ckpts, "9", "meta", "metadata"), '{"step": 9, "vo')
  return run


def _poison_weights(hf_dir: str) -> None:
  from safetensors.numpy import load_file, save_file
  path = os.path.join(hf_dir, "model.safetensors")
  state = load_file(path)
  for name, value in (("bert.embeddings.LayerNorm.bias", np.nan),
                      ("cls.seq_relationship.bias", np.inf)):
    state[name] = state[name].copy()
    state[name][0] = value
  save_file(state, path, metadata={"format": "pt"})


def _exported(res: Result, call: Call) -> None:
  assert os.path.isfile(os.path.join(call.args[2], "model.safetensors"))


def _imported_ok(res: Result, call: Call) -> None:
  assert os.path.isdir(os.path.join(call.args[2], "checkpoints", "0"))


def _other_vocabulary(w: World, d) -> dict[str, Any]:
  """Overrides for a vocabulary of the same size with two tokens swapped, its data
  prepared in the case folder beforehand (a failed run writes nothing)."""
  other = list(VOCAB)
  other[5], other[6] = other[6], other[5]
  overrides = {"data.vocab_file": _text(d / "other_vocab.txt", "".join(t + "\n" for t in other)),
               "data.cache_dir": str(d / "cache")}
  c = _config({**w.base(), **overrides})
  dataset.prepare(settings.data_settings(c), [SEQ_LEN], c.data.cache_dir, c.seed)
  return overrides
