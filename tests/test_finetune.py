"""Fine-tuning: it learns a task that depends on the text, 8 devices match 1, the
export loads in transformers with the same logits, regression, bad input."""

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax.commands import finetune as finetune_cli
from bert_jax.io import checkpointing, convert
from bert_jax.commands import convert as convert_cli
from bert_jax.eval import classifier, finetune, finetune_report, tasks
from bert_jax.settings.model import ModelConfig
from bert_jax.model.build import init_params
from bert_jax.data.tokenizer import SPECIAL_TOKENS
import tiny_run

WORDS = ("the cat dog sat on a mat and ran to house tree bird sang loud quiet "
         "river flows past old stone bridge").split()
VOCAB = list(SPECIAL_TOKENS) + WORDS
CONFIG = tiny_run.bert_config(len(VOCAB), num_layers=1)
OTHERS = [w for w in WORDS if w != "cat"]
# A tiny random model needs a larger step than BERT's 2e-5..5e-5 to learn in 48 steps.
LR, EPOCHS, BATCH = 3e-3, 6, 32


def _examples(rs, n, label_fn):
  """Random word strings, half of them with 'cat' inserted somewhere."""
  out = []
  for _ in range(n):
    words = list(rs.choice(OTHERS, size=rs.randint(3, 12)))
    for _ in range(rs.randint(1, 4) if rs.rand() < 0.5 else 0):
      words.insert(rs.randint(len(words) + 1), "cat")
    out.append((label_fn(words), " ".join(words)))
  return out


def _write_task(directory, label_fn, n_train=256, n_dev=128, seed=0):
  rs = np.random.RandomState(seed)
  os.makedirs(directory, exist_ok=True)
  for name, n in (("train", n_train), ("dev", n_dev)):
    with open(os.path.join(directory, f"{name}.tsv"), "w", encoding="utf-8") as f:
      f.write("label\ttext\n")
      f.writelines(f"{label}\t{text}\n" for label, text in _examples(rs, n, label_fn))
  return directory


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("finetune")
  ckpt = str(root / "pretrained")
  # A params-only checkpoint as bert_jax.io.convert writes one (the pre-training tree).
  checkpointing.save_params(ckpt, 0, init_params(CONFIG, jax.random.key(0)),
                            {"model_config": CONFIG.to_dict(), "vocab": VOCAB, "lowercase": True})
  task_dir = _write_task(str(root / "has_cat"), lambda w: "yes" if "cat" in w else "no")
  # Float targets: whether 'cat' occurs, plus a quarter per occurrence.
  reg_dir = _write_task(str(root / "cat_score"),
                        lambda w: f"{float('cat' in w) + 0.25 * w.count('cat'):.2f}",
                        n_dev=64, seed=1)
  return root, ckpt, task_dir, reg_dir


@pytest.fixture(scope="module")
def cli_run(data):
  """The command line on all 8 devices, with --save."""
  root, ckpt, task_dir, _ = data
  out, save = str(root / "out"), str(root / "saved")
  rc = finetune_cli.main(["--checkpoint", ckpt, "--task", task_dir, "--output_dir", out,
                          "--learning_rates", str(LR), "--seeds", "0",
                          "--epochs", str(EPOCHS), "--batch_size", str(BATCH),
                          "--save", save, "--no_progress"])
  assert rc == 0
  with open(os.path.join(out, "results.json")) as f:
    return json.load(f), out, save


@pytest.mark.slow
def test_learns_whether_a_word_occurs(data, cli_run):
  results, out, _ = cli_run
  acc = results["runs"][0]["metrics"]["dev"]["accuracy"]
  with open(os.path.join(data[2], "dev.tsv"), encoding="utf-8") as f:
    labels = [line.split("\t")[0] for line in f.read().splitlines()[1:]]
  majority = max(labels.count("yes"), labels.count("no")) / len(labels)
  assert acc >= 0.9 > majority + 0.2, (acc, majority)
  # Which checkpoint step was read, and the constant guess the accuracy must beat
  # (train's most common class, answered on dev).
  with open(os.path.join(data[2], "train.tsv"), encoding="utf-8") as f:
    train = [line.split("\t")[0] for line in f.read().splitlines()[1:]]
  common = max(set(train), key=train.count)
  assert results["checkpoint_step"] == 0
  assert results["majority_accuracy"]["dev"] == labels.count(common) / len(labels)
  assert results["devices"] == 8 and results["summary"]["best_learning_rate"] == LR
  assert results["summary"]["best"]["dev"]["accuracy"] == acc  # the median of one seed
  assert results["recipe"]["num_steps"] == EPOCHS * results["recipe"]["steps_per_epoch"]
  # TensorBoard events and the per-run history
  run_dir = os.path.join(out, "runs", f"lr{LR:g}_seed0")
  assert any(n.startswith("events.") for n in os.listdir(os.path.join(run_dir, "tensorboard")))
  history = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
  assert [r["step"] for r in history if r["split"] == "dev"] == [
      (e + 1) * results["recipe"]["steps_per_epoch"] for e in range(EPOCHS)]


@pytest.mark.slow
def test_one_device_matches_eight(data, cli_run):
  _, ckpt, task_dir, _ = data
  results8, _, save = cli_run
  task = tasks.load_task(task_dir)
  recipe = finetune.Recipe(learning_rates=(LR,), seeds=(0,), epochs=EPOCHS, batch_size=BATCH)
  tuner = finetune.FineTuner.from_checkpoint(ckpt, task, recipe, devices=jax.devices()[:1])
  results1 = tuner.sweep(output_dir=None, progress=False)
  assert results1["devices"] == 1
  run1, run8 = results1["runs"][0], results8["runs"][0]
  assert abs(run1["train_loss"] - run8["train_loss"]) < 1e-3
  assert abs(run1["metrics"]["dev"]["accuracy"] - run8["metrics"]["dev"]["accuracy"]) <= 2 / 128
  saved, meta = checkpointing.restore_params(save)
  assert meta["classifier"]["labels"] == ["no", "yes"]
  diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                       tuner.best_params, saved)
  assert max(jax.tree.leaves(diffs)) < 1e-3


@pytest.mark.slow
def test_export_loads_in_transformers_with_the_same_logits(data, cli_run, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  _, _, save = cli_run
  hf_dir = str(tmp_path / "hf")
  assert convert_cli.main(["to-hf", save, hf_dir]) == 0
  model, info = transformers.BertForSequenceClassification.from_pretrained(
      hf_dir, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert model.config.id2label == {0: "no", 1: "yes"}
  assert model.config.problem_type == "single_label_classification"
  model.eval()
  # Our logits of the same inputs, from the saved checkpoint.
  params, meta = checkpointing.restore_params(save)
  config = ModelConfig.from_dict(meta["model_config"])
  texts = ["the cat sat on a mat", "dog ran to old stone bridge", "bird sang cat cat"]
  tok = transformers.BertTokenizer.from_pretrained(hf_dir)
  enc = tok(texts, padding=True, return_tensors="np")
  ours = classifier.SequenceClassifier(config, 2).apply(
      {"params": params}, enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
  with torch.no_grad():
    theirs = model(**{k: torch.tensor(v) for k, v in enc.items()}).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)


@pytest.mark.slow
def test_regression_reports_pearson_and_spearman(data, tmp_path):
  _, ckpt, _, reg_dir = data
  task = tasks.load_task(reg_dir)
  assert task.kind == "regression" and task.num_classes == 1
  recipe = finetune.Recipe(learning_rates=(LR,), seeds=(0, 1), epochs=EPOCHS, batch_size=BATCH)
  tuner = finetune.FineTuner.from_checkpoint(ckpt, task, recipe)
  results = tuner.sweep(output_dir=str(tmp_path), progress=False)
  assert results["metric_names"] == ["pearson", "spearman"]
  for run in results["runs"]:
    assert run["metrics"]["dev"]["pearson"] > 0.5, run  # well above 0: the score is learnt
  scores = [r["metrics"]["dev"]["pearson"] for r in results["runs"]]
  assert results["summary"]["best"]["dev"]["pearson"] == pytest.approx(np.median(scores))
  assert json.load(open(tmp_path / "results.json"))["summary"] == json.loads(
      json.dumps(results["summary"]))
  assert "spearman" in finetune_report.format_table(results)


def _bad(argv, capsys, tmp_path):
  before = sorted(os.listdir(tmp_path))
  assert finetune_cli.main(argv + ["--output_dir", str(tmp_path / "out"),
                                   "--save", str(tmp_path / "save")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: "), err
  assert sorted(os.listdir(tmp_path)) == before  # nothing written
  return err[0]


def test_bad_input_is_one_error_line_and_writes_nothing(data, capsys, tmp_path):
  root, ckpt, task_dir, _ = data
  assert "no such directory" in _bad(["--checkpoint", str(root / "nope"), "--task", task_dir],
                                     capsys, tmp_path)
  assert "task" in _bad(["--checkpoint", ckpt, "--task", str(root / "no_task")], capsys, tmp_path)
  assert "--learning_rates" in _bad(["--checkpoint", ckpt, "--task", task_dir,
                                     "--learning_rates", "fast"], capsys, tmp_path)
  assert "--epochs" in _bad(["--checkpoint", ckpt, "--task", task_dir, "--epochs", "0"],
                            capsys, tmp_path)
  assert "max_position_embeddings" in _bad(["--checkpoint", ckpt, "--task", task_dir,
                                            "--max_length", "512"], capsys, tmp_path)
  assert "--checkpoint" in _bad(["--task", task_dir], capsys, tmp_path)  # argparse's own
  # A checkpoint folder without params: only meta was written.
  no_params = str(tmp_path / "no_params")
  mngr = checkpointing.manager(os.path.join(no_params, "checkpoints"), async_save=False)
  mngr.save(0, args=ocp.args.Composite(meta=ocp.args.JsonSave(
      {"model_config": CONFIG.to_dict(), "vocab": VOCAB, "lowercase": True})))
  mngr.wait_until_finished()
  mngr.close()
  assert "params" in _bad(["--checkpoint", no_params, "--task", task_dir], capsys, tmp_path)


MNLI_HEAD = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
             "sentence1_parse\tsentence2_parse\tsentence1\tsentence2")
MNLI_LABELS = ("contradiction", "entailment", "neutral")


@pytest.mark.slow
def test_mnli_layout_pairs_two_dev_splits_bfloat16(data, tmp_path):
  """GLUE's MNLI files (sentence pairs; dev_matched and dev_mismatched) in mixed precision."""
  _, ckpt, _, _ = data
  rs = np.random.RandomState(2)
  directory = tmp_path / "MNLI"
  directory.mkdir()
  for name, n, extra in (("train", 64, "\tlabel1\tgold_label"),
                         ("dev_matched", 24, "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label"),
                         ("dev_mismatched", 16, "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")):
    lines = [MNLI_HEAD + extra]
    for i in range(n):
      a, b = (" ".join(rs.choice(WORDS, size=rs.randint(2, 20))) for _ in range(2))
      label = MNLI_LABELS[rs.randint(3)]
      golds = "\t".join([label] * extra.count("label"))
      lines.append(f"{i}\t{i}\t{i}n\tfiction\t( x )\t( y )\t(S x)\t(S y)\t{a}\t{b}\t{golds}")
    (directory / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
  task = tasks.load_task(str(directory))
  assert task.eval_splits == ("dev_matched", "dev_mismatched")
  # max_length 32: two buckets (16, 32), and the longest pairs are truncated.
  recipe = finetune.Recipe(learning_rates=(1e-3,), seeds=(0,), epochs=1, batch_size=16,
                           max_length=32, dtype="bfloat16")
  tuner = finetune.FineTuner.from_checkpoint(ckpt, task, recipe)
  assert tuner.config.dtype == "bfloat16" and tuner.steps_per_epoch >= 4
  results = tuner.sweep(output_dir=None, progress=False)
  metrics = results["runs"][0]["metrics"]
  assert set(metrics) == {"dev_matched", "dev_mismatched"}
  assert all(0.0 <= m["accuracy"] <= 1.0 for m in metrics.values())
  assert np.isfinite(results["runs"][0]["train_loss"])
  assert results["summary"]["selection"] == {"split": "dev_matched", "metric": "accuracy"}
  table = finetune_report.format_table(results)
  assert "dev_matched accuracy" in table and "dev_mismatched accuracy" in table
  # Pairs use both segments: [CLS] A [SEP] B [SEP].
  assert max(max(s) for s in tuner.train_split.segments) == 1
  assert tuner.train_split.num_truncated > 0 and max(tuner.train_split.lengths_N) == 32
  assert {L for _, L in tuner.compiled_lengths} == {16, 32}


def test_the_report_names_train_loss_and_sets_dev_accuracy_against_the_majority_class():
  # word_order once reported 0.4959 under its majority class 0.504 without saying so.
  run = {"learning_rate": 2e-5, "seed": 0, "train_loss": 0.69, "metrics": {"dev": {
      "accuracy": 0.4959}}}
  results = {"eval_splits": ["dev"], "metric_names": ["accuracy"], "runs": [run],
             "num_examples": {"train": 287, "dev": 123},
             "majority_accuracy": {"dev": 0.504}, "recipe": {"seeds": [0]},
             "summary": {"median_by_learning_rate": [
                 {"learning_rate": 2e-5, "metrics": run["metrics"]}],
                 "selection": {"split": "dev", "metric": "accuracy"},
                 "best_learning_rate": 2e-5, "best": run["metrics"]}}
  lines = finetune_report.format_table(results).splitlines()
  assert lines[0].split()[:3] == ["lr", "seed", "train"] and "loss" in lines[0]
  assert lines[-1].endswith("dev accuracy 0.4959 ± 0.0451 (majority class 0.5040; not above "
                            "it)"), lines[-1]


MODERN = tiny_run.bert_config(len(VOCAB), family="modernbert", num_layers=2, num_heads=2,
                              global_attn_every_n_layers=2, local_attention=4,
                              layer_norm_eps=1e-5, dropout_rate=0.0,
                              attention_dropout_rate=0.0)


@pytest.mark.slow
def test_a_fine_tuned_modernbert_exports_as_transformers_sequence_classifier(data, tmp_path,
                                                                             capsys):
  """The export command `finetune` prints works for a ModernBERT: the encoder, the
  pre-trained prediction head the classifier applies (as transformers does) and the
  classifier, loaded by ModernBertForSequenceClassification with the same logits."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  _, _, task_dir, _ = data
  ckpt, save, hf_dir = (str(tmp_path / n) for n in ("pretrained", "saved", "hf"))
  pretrained = init_params(MODERN, jax.random.key(1))
  checkpointing.save_params(ckpt, 0, pretrained, {"model_config": MODERN.to_dict(),
                                                  "vocab": VOCAB, "lowercase": True})
  assert finetune_cli.main(["--checkpoint", ckpt, "--task", task_dir, "--output_dir",
                            str(tmp_path / "out"), "--learning_rates", str(LR), "--seeds", "0",
                            "--epochs", "1", "--batch_size", str(BATCH), "--save", save,
                            "--no_progress"]) == 0
  export = capsys.readouterr().out.split("export: ")[-1].split()
  assert export[:5] == ["python", "-m", "bert_jax.convert", "to-hf", save]
  assert convert_cli.main(["to-hf", save, hf_dir]) == 0
  model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
      hf_dir, output_loading_info=True, attn_implementation="eager")
  assert type(model).__name__ == "ModernBertForSequenceClassification"
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert model.config.id2label == {0: "no", 1: "yes"}
  model.eval()
  params, meta = checkpointing.restore_params(save)
  # The head the classifier applied started from the pre-trained one, and trained.
  assert sorted(params) == ["bert", "classifier", "head_dense", "head_norm"]
  assert not np.allclose(params["head_dense"]["kernel"], pretrained["head_dense"]["kernel"])
  config = ModelConfig.from_dict(meta["model_config"])
  ids = np.array([[2, 10, 11, 12, 3, 0], [2, 13, 14, 15, 16, 3]], np.int32)  # [CLS] .. [SEP]
  mask = (ids != 0).astype(np.int32)
  ours = classifier.SequenceClassifier(config, 2).apply(
      {"params": params}, ids, np.zeros_like(ids), mask)
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=1e-4)
