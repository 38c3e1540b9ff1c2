"""Benchmark tools (tools/) with tiny sizes: FLOP formula, one run end to end, errors,
the data-preparation benchmark and the profiler."""

import dataclasses
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from bert_jax.settings.model import ModelConfig
from bert_jax.model.bert import BertForPreTraining, BertModel
from tools import bench, bench_prepare, measure

GUIDE = "# x\n\n## Performance\n\nintro\n\n<!-- bench:start -->\nold table\n<!-- bench:end -->\n\nafter\n"


@pytest.mark.parametrize("kind", ["features", "train"])
def test_analytic_flops_cover_what_xla_counts_but_elementwise_work(kind):
  size = bench.ModelSize(2, 256, 4, 1024, 1000, "float32")
  cfg = ModelConfig(vocab_size=1000, hidden_size=256, num_layers=2, num_heads=4,
                   intermediate_size=1024, max_position_embeddings=128)
  B, L, P = 2, 128, 20
  ids, pos = jnp.ones((B, L), jnp.int32), jnp.ones((B, P), jnp.int32)
  if kind == "features":
    model, args = BertModel(cfg), (ids, ids, ids)
    out = lambda o: o.sequence_BxLxD.sum() + o.pooled_BxD.sum()
  else:
    model, args = BertForPreTraining(cfg), (ids, ids, ids, pos)
    out = lambda o: o.mlm_logits_BxPxV.sum() + o.nsp_logits_Bx2.sum()
  params = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.key(0), *args))["params"])
  compiled = jax.jit(lambda p, *a: out(model.apply({"params": p}, *a))).lower(params, *args).compile()
  cost = compiled.cost_analysis()
  xla_flops = (cost[0] if isinstance(cost, list) else cost)["flops"]
  # A train step counts 3 forwards; XLA's count adds softmax, GELU, LayerNorm.
  analytic = bench.model_flops(size, kind, B, L, P) / (3 if kind == "train" else 1)
  assert 0.9 * xla_flops <= analytic <= xla_flops


def test_a_run_writes_json_markdown_and_only_the_guide_block(tmp_path, monkeypatch):
  # The plumbing, not the speed: a 64-wide BERT in place of BERT-Base.
  mini = bench.ModelSize(2, 64, 2, 128, 1000, "float32")
  monkeypatch.setattr(bench, "model_sizes", lambda: {"tiny": mini, "small": mini, "base": mini})
  readme = tmp_path / "performance.md"
  readme.write_text(GUIDE)
  out, md = tmp_path / "r.json", tmp_path / "r.md"
  # Feature extraction: the cheapest compile; a train step goes the same way.
  rc = bench.main(["--quick", "--in-process", "--cases", "features_base_128",
                   "--impls", "ours,hf_torch", "--steps", "2", "--warmup", "0", "--peak-n", "256",
                   "--dtypes", "float32",  # bf16 rows too where bf16 dots are native
                   "--out", str(out), "--md", str(md), "--readme", "--readme-path", str(readme)])
  assert rc == 0
  result = json.loads(out.read_text())
  by_impl = {(r["impl"], r["dtype"]): r for r in result["rows"]}
  assert set(by_impl) == {("ours", "float32"), ("hf_torch", "float32")}
  ours = by_impl["ours", "float32"]
  assert ours["tokens_per_s"] > 0 and ours["timed_steps"] == 2
  assert ours["min_s"] <= ours["median_s"] <= ours["max_s"]
  assert ours["ratio_vs_hf_torch"] == pytest.approx(
      ours["tokens_per_s"] / by_impl["hf_torch", "float32"]["tokens_per_s"])
  text = readme.read_text()
  assert "old table" not in text and md.read_text() in text
  before, after = GUIDE.split("<!-- bench:start -->")[0], GUIDE.split("<!-- bench:end -->")[1]
  assert text.startswith(before + "<!-- bench:start -->") and text.endswith(
      "<!-- bench:end -->" + after)


def test_a_guide_without_markers_is_a_one_line_error_before_anything_runs(tmp_path, capsys):
  readme = tmp_path / "performance.md"
  readme.write_text("# no markers\n")
  out = tmp_path / "r.json"
  rc = bench.main(["--cases", "train_base_512", "--out", str(out), "--readme",
                   "--readme-path", str(readme)])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and err.startswith("error: ") and "\n" not in err and str(readme) in err
  assert not out.exists() and readme.read_text() == "# no markers\n"


def test_an_unknown_case_is_a_one_line_error(capsys):
  assert bench.main(["--cases", "train_huge_128"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: --cases") and "train_huge_128" in err and "\n" not in err


def test_batch_overrides_reach_the_chosen_cases_only(tmp_path, monkeypatch):
  mini = bench.ModelSize(1, 64, 2, 128, 1000, "float32")
  monkeypatch.setattr(bench, "model_sizes", lambda: {"tiny": mini, "small": mini, "base": mini})
  out = tmp_path / "r.json"
  rc = bench.main(["--quick", "--in-process", "--cases", "features_base_128,train_tiny_128",
                   "--impls", "ours", "--steps", "1", "--warmup", "0", "--peak-n", "128",
                   "--batch", "features_base_128=3", "--out", str(out),
                   "--md", str(tmp_path / "r.md")])
  assert rc == 0
  rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
  assert rows["features_base_128"]["batch"] == 3
  assert rows["train_tiny_128"]["batch"] == 4  # its own 32, as --quick clamps it


@pytest.mark.parametrize("spec", ["train_base_512=0", "features_base_128=8", "train_tiny_128"])
def test_a_bad_batch_override_is_a_one_line_error(spec, capsys):
  assert bench.main(["--cases", "train_tiny_128", "--batch", spec]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: --batch") and "\n" not in err


def test_hf_flax_is_skipped_with_its_reason_under_transformers_5(monkeypatch):
  # transformers 5 (as on the GPU image seen so far) has no Flax models: say so, do not crash.
  monkeypatch.setattr(bench.importlib.metadata, "version", lambda name: "5.17.0")
  available = bench.peers_available()
  assert "5.17.0 has no Flax models" in available["hf_flax"]
  assert available["hf_flax_masked"] == available["hf_flax"]
  assert available["hf_torch"] is None or "not installed" in available["hf_torch"]


def test_prepare_benchmark_times_a_small_synthetic_corpus(tmp_path):
  r = bench_prepare.benchmark_prepare(megabytes=1.0, seq_len=64, vocab_size=1000,
                                      workdir=str(tmp_path))
  assert 0.9 < r["corpus_mb"] < 1.1 and r["documents"] > 0 and r["examples"] > 0
  assert r["tokens"] > 0 and r["example_tokens"] > 0 and r["seconds"] > 0
  # The keys tools.bench reads for its 'prepare' row.
  assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
  assert r["median_s"] == r["seconds"] and r["peak_mem_bytes"] > 0
  assert r["what"].startswith("dataset.prepare(1 MiB of text, seq 64")
  assert list(tmp_path.iterdir()) == []  # the corpus, vocabulary and cache are gone


@pytest.fixture(scope="module")
def profile_output():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "XLA_FLAGS": ""}  # one device, as the benchmark
  out = subprocess.run(
      [sys.executable, os.path.join(root, "tools", "profile_step.py"), "--case",
       "train_tiny_128", "--batch", "4", "--steps", "2", "--top", "3", "--timeline", "layer_1"],
      capture_output=True, text=True, env=env, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  return out.stdout


@pytest.mark.slow
def test_profile_script_attributes_op_time_to_model_parts(profile_output):
  parts = profile_output.split("by model part:")[1].split("by op kind:")[0]
  shares = {line.split("%")[1].strip(): float(line.split("ms")[1].split("%")[0])
            for line in parts.strip().splitlines()}
  assert abs(sum(shares.values()) - 100.0) < 0.5
  for part in ("MLM head + loss", "attention", "feed-forward", "optimizer"):
    assert shares.get(part, 0.0) > 0.0, shares


def test_profile_parts_tell_the_attention_core_from_the_tied_mlm_logits():
  from tools import profile_step
  src = "jit(step_fn)/{}(BertForPreTraining)/{}/dot_general"
  for jvp in ("jvp", "transpose(jvp"):
    assert profile_step._part(src.format(
        jvp, "bert/layer_0/attention/attention._attend")) == "attention"
    assert profile_step._part(src.format(
        jvp, "embeddings.attend/word_embeddings.attend")) == "MLM head + loss"
  assert profile_step._part(src.format(
      "jvp", "bert/layer_0/attention/attention._attend/Dropout_0")) == "dropout RNG + mask"


@pytest.mark.slow
def test_profile_timeline_lists_one_layer_of_one_step_in_time_order(profile_output):
  header, _, body = profile_output.partition("timeline of /layer_1/ in the last step: ")
  assert body, profile_output[-2000:]
  span_ms = float(body.split(" ms")[0])
  rows = [line.split() for line in body.splitlines()[1:] if line.strip()]
  starts = [float(r[0]) for r in rows]
  assert rows and starts == sorted(starts) and starts[0] == 0.0
  assert all(float(r[0]) + float(r[1]) <= span_ms + 0.1 for r in rows)
  assert all("layer_1/" in r[-1] for r in rows)
  # One step's layer: each op once (two steps were traced).
  names = [r[3] for r in rows]
  assert len(names) == len(set(names)), names


def _mini_case():
  from tools import cases
  return cases.Case("t", "train", "tiny", 2, 32, 5), bench.ModelSize(2, 64, 2, 128, 500, "float32")


def test_the_masked_head_torch_peer_computes_the_shipped_loss():
  torch = pytest.importorskip("torch")
  from transformers import BertForPreTraining
  from tools import cases, peers
  case, size = _mini_case()
  torch.manual_seed(0)
  model = BertForPreTraining(peers._hf_config(size)).eval()  # no dropout: one loss
  b = {k: torch.from_numpy(v.astype("int64")) for k, v in cases.make_batch(case, 500).items()}
  with torch.no_grad():
    shipped, masked = (float(peers.torch_loss(model, b, m)) for m in (False, True))
  assert masked == pytest.approx(shipped, rel=1e-5)


@pytest.mark.slow  # torch.compile's first call compiles C++ on the CPU
def test_the_compiled_torch_peer_computes_the_masked_head_loss():
  torch = pytest.importorskip("torch")
  from transformers import BertForPreTraining
  from tools import cases, peers
  case, size = _mini_case()
  size = dataclasses.replace(size, num_layers=1)  # inductor compiles each layer: 25 s, not 40
  torch.manual_seed(0)
  model = BertForPreTraining(peers._hf_config(size)).eval()
  b = {k: torch.from_numpy(v.astype("int64")) for k, v in cases.make_batch(case, 500).items()}
  with torch.no_grad():
    eager = float(peers.torch_loss(model, b, True))
    compiled = float(torch.compile(peers.torch_loss)(model, b, True))
  assert compiled == pytest.approx(eager, rel=1e-4)


def test_the_masked_head_flax_peer_computes_the_shipped_loss():
  transformers = pytest.importorskip("transformers")
  if not hasattr(transformers, "FlaxBertForPreTraining"):  # transformers 5 has no Flax
    pytest.skip("transformers 5 dropped the Flax models: the Flax peer runs with 4.57 "
                "(Python 3.11's peers)")
  from transformers import FlaxBertForPreTraining
  from tools import peers
  case, size = _mini_case()
  model = FlaxBertForPreTraining(peers._hf_config(size), seed=0, _do_init=False)
  params = model.init_weights(jax.random.key(0), (1, 8))
  key = jax.random.key(1)
  shipped = peers.flax_loss(model, params, peers.flax_batch(case, 500, False), key, False, False)
  masked = peers.flax_loss(model, params, peers.flax_batch(case, 500, True), key, True, False)
  assert float(masked) == pytest.approx(float(shipped), rel=1e-5)


def test_bf16_peers_run_where_bf16_dots_are_native_and_masked_heads_only_on_train_cases():
  from tools import cases
  cases_ = [cases.find("train_small_128"), cases.find("features_base_128")]
  native = {(j.case, j.impl, j.dtype) for j in bench.plan(cases_, bench.IMPLS, bf16=True)}
  assert ("train_small_128", "hf_torch_masked", "bfloat16") in native
  assert ("features_base_128", "hf_torch", "bfloat16") in native
  assert ("train_small_128", "ours", "bfloat16") in native
  assert not any(i.endswith("_masked") and c.startswith("features") for c, i, _ in native)
  emulated = {(j.case, j.impl, j.dtype) for j in bench.plan(cases_, bench.IMPLS, bf16=False)}
  assert not any(d == "bfloat16" and i != "ours" for _, i, d in emulated)


def test_hf_flax_runs_in_bf16_where_bf16_dots_are_native():
  # Its strongest configuration there: the model's dtype=bfloat16, as a skilled user sets it.
  from tools import cases
  jobs = bench.plan([cases.find("train_small_128")], bench.IMPLS, bf16=True)
  assert {j.dtype for j in jobs if j.impl in ("hf_flax", "hf_flax_masked")} == {
      "float32", "bfloat16"}


def test_dtypes_keeps_only_the_rows_of_those_dtypes():
  # A GPU lease fits the bf16 rows, not every row twice.
  from tools import cases
  cases_ = [cases.find("train_base_128"), cases.find("features_base_128"), cases.find("prepare")]
  jobs = bench.plan(cases_, bench.IMPLS, bf16=True, dtypes=("bfloat16",))
  assert {j.dtype for j in jobs} == {"bfloat16", ""}  # "": data preparation has no dtype
  assert {j.impl for j in jobs if j.dtype} == set(bench.IMPLS)
  assert bench.main(["--cases", "train_tiny_128", "--dtypes", "bf16"]) == 2


def _mini_run(tmp_path, monkeypatch, out, *extra):
  mini = bench.ModelSize(2, 64, 2, 128, 1000, "float32")
  monkeypatch.setattr(bench, "model_sizes", lambda: {"tiny": mini, "small": mini, "base": mini})
  return bench.main(["--quick", "--in-process", "--cases", "features_base_128", "--steps", "1",
                     "--warmup", "0", "--peak-n", "128", "--out", str(out),
                     "--md", str(tmp_path / "run.md"),
                     "--dtypes", "float32",  # the same rows whether or not bf16 dots are native
                     *extra])


def test_a_run_cut_short_keeps_the_rows_it_measured(tmp_path, monkeypatch):
  # As on a device lease that ends mid-run: every finished row is already on disk.
  real = bench.run_job

  def run_job(job, *args):
    if job.impl != "ours":
      raise KeyboardInterrupt  # the lease ends during the peer's row
    return real(job, *args)

  monkeypatch.setattr(bench, "run_job", run_job)
  out = tmp_path / "r.json"
  with pytest.raises(KeyboardInterrupt):
    _mini_run(tmp_path, monkeypatch, out, "--impls", "ours,hf_torch")
  saved = json.loads(out.read_text())
  assert saved["partial"] and [r["impl"] for r in saved["rows"]] == ["ours"]
  assert "PARTIAL run" in bench.markdown(saved)


def test_from_json_merges_two_runs_into_one_table_with_ratios(tmp_path, monkeypatch, capsys):
  a, b = tmp_path / "a.json", tmp_path / "b.json"
  assert _mini_run(tmp_path, monkeypatch, a, "--impls", "ours") == 0
  assert _mini_run(tmp_path, monkeypatch, b, "--impls", "ours,hf_torch", "--dtypes",
                   "float32") == 0
  run_b = json.loads(b.read_text())
  run_b["rows"] = [r for r in run_b["rows"] if r["impl"] == "hf_torch"]
  b.write_text(json.dumps(run_b))
  readme = tmp_path / "performance.md"
  readme.write_text(GUIDE)
  md = tmp_path / "merged.md"
  assert bench.main(["--from-json", f"{a},{b}", "--md", str(md), "--readme",
                     "--readme-path", str(readme), "--out", str(tmp_path / "unused.json")]) == 0
  assert not (tmp_path / "unused.json").exists()  # nothing ran, nothing measured to save
  table = md.read_text()
  assert table in readme.read_text() and "PARTIAL" not in table
  ours = json.loads(a.read_text())["rows"][0]
  ratio = ours["tokens_per_s"] / run_b["rows"][0]["tokens_per_s"]
  ours_line = next(line for line in table.splitlines() if line.startswith(
      "| features_base_128 | bert-jax"))
  assert ours_line.rstrip(" |").endswith(f"{ratio:.2f}")
  assert "; python -m tools.bench" in table  # both commands are named


@pytest.mark.parametrize("bad", ["not json", '{"no": "rows"}', "other machine"])
def test_from_json_rejects_what_it_cannot_merge_in_one_line(tmp_path, monkeypatch, capsys, bad):
  a, b = tmp_path / "a.json", tmp_path / "b.json"
  assert _mini_run(tmp_path, monkeypatch, a, "--impls", "ours") == 0
  other = json.loads(a.read_text())
  other["machine"]["gpu"] = "NVIDIA H100"
  b.write_text(json.dumps(other) if bad == "other machine" else bad)
  md = tmp_path / "m.md"
  capsys.readouterr()
  assert bench.main(["--from-json", f"{a},{b}", "--md", str(md)]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err and not md.exists()
  assert str(b) in err or "different machines" in err


def test_a_config_dtype_of_auto_runs_as_the_trainer_resolves_it():
  """BERT-Base's config says 'auto': the bench runs it as bfloat16 where bf16 dots are
  native and as float32 elsewhere, never as a dtype named 'auto' (its worker failed)."""
  from tools import cases
  base = [cases.find("train_base_128")]
  assert cases.model_sizes()["base"].default_dtype == "auto"
  for bf16, want in ((True, "bfloat16"), (False, "float32")):
    ours = {j.dtype for j in bench.plan(base, ["ours"], bf16=bf16)}
    assert "auto" not in ours and want in ours
    assert bench.config_dtype(cases.model_sizes()["base"], bf16) == want


def test_the_bench_process_leaves_the_gpu_memory_to_its_workers(monkeypatch):
  # The parent opens the device to ask what it is; JAX's default would keep 75% of a GPU.
  monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
  monkeypatch.setattr(bench, "_parent_set", set())
  bench._parent_env()
  assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
  assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in bench._worker_env()  # workers: JAX's default
  monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")  # the user's own setting stays
  monkeypatch.setattr(bench, "_parent_set", set())
  bench._parent_env()
  assert bench._worker_env()["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_every_worker_gets_the_same_host_allocator_and_system_keeps_glibcs(monkeypatch):
  from bert_jax.parallel import host_malloc
  monkeypatch.setattr(host_malloc, "glibc_version", lambda: (2, 36))
  monkeypatch.setattr(host_malloc, "thp_available", lambda: True)
  monkeypatch.setattr(host_malloc.bert_jax, "has_accelerator", lambda: False)
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
  assert bench._worker_env("huge-pages")["GLIBC_TUNABLES"] == (
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
  assert bench._worker_env("system")["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
  assert bench._worker_env("retain")["GLIBC_TUNABLES"] == (
      "glibc.malloc.arena_max=2:" + bench.RETAIN)


def test_a_preloaded_allocator_is_found_or_named_in_one_error(monkeypatch, tmp_path):
  (tmp_path / "libjemalloc.so.2").write_bytes(b"")
  monkeypatch.setattr(bench, "_LIB_DIRS", (str(tmp_path / "none"), str(tmp_path)))
  assert bench.worker_malloc("jemalloc") == {"LD_PRELOAD": str(tmp_path / "libjemalloc.so.2")}
  with pytest.raises(bench.ConfigError, match="no libtcmalloc_minimal.so.4 in .*apt install"):
    bench.worker_malloc("tcmalloc")


def test_an_ab_variant_splits_into_config_overrides_xla_flags_and_environment():
  from tools import ab_step
  v = "model.remat=True,xla_cpu_scheduler_type=X,BERT_JAX_MALLOC=system,model.dropout_rng=hash"
  assert ab_step.parse_variant(v) == {"model.remat": True, "model.dropout_rng": "hash"}
  assert ab_step.xla_flags(v) == ["--xla_cpu_scheduler_type=X"]
  assert ab_step.env_items(v) == {"BERT_JAX_MALLOC": "system"}


def test_from_json_a_row_measured_again_replaces_the_earlier_one(tmp_path, monkeypatch):
  a, b = tmp_path / "a.json", tmp_path / "b.json"
  assert _mini_run(tmp_path, monkeypatch, a, "--impls", "ours,hf_torch") == 0
  again = json.loads(a.read_text())
  again["rows"] = [dict(r, median_s=r["median_s"] / 2, tokens_per_s=r["tokens_per_s"] * 2)
                   for r in again["rows"] if r["impl"] == "ours"]
  again["date"] = "2099-01-01 00:00 UTC"
  b.write_text(json.dumps(again))
  merged = bench.load_results([str(a), str(b)])
  first = json.loads(a.read_text())["rows"]
  assert [(r["impl"], r["dtype"]) for r in merged["rows"]] == [
      (r["impl"], r["dtype"]) for r in first]  # one row each, in the first run's order
  ours = merged["rows"][0]
  assert ours["median_s"] == again["rows"][0]["median_s"]  # the later measurement
  assert ours["ratio_vs_hf_torch"] == pytest.approx(
      2 * first[0]["tokens_per_s"] / first[1]["tokens_per_s"])
  table = bench.markdown(merged)
  assert table.count("| features_base_128 | bert-jax") == 1
  assert "replacing the earlier run's rows: bert-jax float32 on features_base_128" in table
  assert "2099-01-01" in table and json.loads(a.read_text())["date"] in table


def test_the_jax_bf16_peak_times_the_bf16_x_bf16_to_f32_dot_mixed_precision_runs():
  a = jnp.ones((8, 8), jnp.bfloat16)
  (dot,) = [e for e in jax.make_jaxpr(measure.jax_peak_dot)(a, a).eqns
            if e.primitive.name == "dot_general"]
  assert [v.aval.dtype for v in dot.invars] == [jnp.bfloat16] * 2
  assert dot.outvars[0].aval.dtype == jnp.float32
