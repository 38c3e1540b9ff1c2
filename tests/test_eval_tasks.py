"""Task readers: every GLUE task in the official distribution's layout, plain dirs, TFDS, bad input."""

import os

import numpy as np
import pytest

from bert_jax.errors import TaskError
from bert_jax.eval import tasks, tasks_tfds
from bert_jax.eval.tasks import Example

T = "\t"


def _write(path, lines):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8", newline="") as f:
    f.write("".join(l + "\n" for l in lines))


def _dir(root, name, files):
  for fname, lines in files.items():
    _write(os.path.join(root, name, fname), lines)
  return os.path.join(root, name)


# Hand-written files in each task's exact GLUE layout (columns, headers, quoting).
COLA = {
    "train.tsv": [T.join(["gj04", "1", "", "Our friends won't buy this analysis, let alone the next one we propose."]),
                  T.join(["gj04", "0", "*", 'The more we study verbs, the "crazier they get.'])],
    "dev.tsv": [T.join(["gj04", "1", "", "Fred watered the plants flat."]),
                T.join(["gj04", "0", "*", "They drank the pub."])],
    "test.tsv": ["index" + T + "sentence", "0" + T + "Bill whistled past the house.",
                 "1" + T + "The car honked its way down the road."],
}
SST2 = {
    "train.tsv": ["sentence\tlabel", "hide new secretions from the parental units \t0",
                  "contains no wit , only labored gags \t0", "that loves its characters \t1"],
    "dev.tsv": ["sentence\tlabel", "it 's a charming and often affecting journey . \t1"],
    "test.tsv": ["index\tsentence", "0\tuneasy mishmash of styles and genres ."],
}
MRPC = {
    "train.tsv": ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                  "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him , Amrozi accused his brother .",
                  "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's in 1995 ."],
    "dev.tsv": ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                "1\t1355540\t1355592\tHe said \"foo\" .\t\"foo\" , he said ."],
    "test.tsv": ["index\t#1 ID\t#2 ID\t#1 String\t#2 String",
                 "0\t1089874\t1089925\tPCCW 's chief .\tCommon chief ."],
}
STSB_HEAD = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
STSB = {
    "train.tsv": [STSB_HEAD + "\tscore",
                  "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tAn air plane is taking off.\t5.000",
                  "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man is playing a flute.\tA man is playing a bamboo flute.\t3.800"],
    "dev.tsv": [STSB_HEAD + "\tscore",
                "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man with a hard hat is dancing.\tA man wearing a hard hat is dancing.\t5.000",
                "1\tmain-captions\tMSRvid\t2012test\t0002\tnone\tnone\tA young child is riding a horse.\tA child is riding a horse.\t4.750"],
    "test.tsv": [STSB_HEAD, "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA girl is styling her hair.\tA girl is brushing her hair."],
}
QQP = {
    "train.tsv": ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                  "133273\t213221\t213222\tHow is the life of a math student?\tWhich level of prepration is enough?\t0",
                  "402555\t536040\t536041\tHow do I control my horny emotions?\tHow do you control your horniness?\t1"],
    "dev.tsv": ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                "201359\t303345\t303346\tWhy are African-Americans so beautiful?\tWhy are hispanics so beautiful?\t0"],
    "test.tsv": ["id\tquestion1\tquestion2", "0\tWould the idea work?\tCould the idea work?"],
}
MNLI_HEAD = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
             "sentence1_parse\tsentence2_parse\tsentence1\tsentence2")
_P = "( ( x ) )\t( ( y ) )\t(ROOT (S x))\t(ROOT (S y))"
MNLI = {
    "train.tsv": [MNLI_HEAD + "\tlabel1\tgold_label",
                  f"0\t31193\t31193n\tgovernment\t{_P}\tConceptually cream skimming has two basic dimensions.\tProduct and geography are what make cream skimming work. \tneutral\tneutral",
                  f"1\t101457\t101457e\ttelephone\t{_P}\tyou know during the season\tYou lose the things.\tentailment\tentailment",
                  f"2\t134793\t134793e\tfiction\t{_P}\tOne of our number will carry out your instructions.\tA member of my team will execute them.\tcontradiction\tcontradiction"],
    "dev_matched.tsv": [MNLI_HEAD + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
                        f"0\t63735\t63735n\tslate\t{_P}\tThe new rights are nice enough\tEveryone really likes the newest benefits \tneutral\tentailment\tneutral\tneutral\tneutral\tneutral"],
    "dev_mismatched.tsv": [MNLI_HEAD + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
                           f"0\t75290\t75290c\tletters\t{_P}\tYour contribution helped.\tYour contributions were of no help.\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction",
                           f"1\t133794\t133794c\tverbatim\t{_P}\tThe answer is \"yes\".\tThe answer is no.\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction"],
    "test_matched.tsv": [MNLI_HEAD, f"0\t31493\t31493\ttravel\t{_P}\tHierbas is a drink.\tHierbas is a drink too."],
    "test_mismatched.tsv": [MNLI_HEAD, f"0\t75290\t75290\tletters\t{_P}\tYour help was great.\tIt helped."],
}
QNLI = {
    "train.tsv": ["index\tquestion\tsentence\tlabel",
                  "0\tWhen did the third Digimon series begin?\tUnlike the two seasons before it.\tnot_entailment",
                  "1\tWhich missile batteries often have individual launchers?\tThey often have launchers.\tentailment"],
    "dev.tsv": ["index\tquestion\tsentence\tlabel", "0\tWhat came into force?\tThe Convention came into force.\tentailment"],
    "test.tsv": ["index\tquestion\tsentence", "0\tWhat organization is IPCC a part of?\tThe WMO."],
}
RTE = {
    "train.tsv": ["index\tsentence1\tsentence2\tlabel",
                  "0\tNo Weapons of Mass Destruction Found in Iraq Yet.\tWeapons of Mass Destruction Found in Iraq.\tnot_entailment",
                  "1\tA place of sorrow, after Pope John Paul II died.\tPope Benedict XVI is the new leader.\tentailment"],
    "dev.tsv": ["index\tsentence1\tsentence2\tlabel", "0\tDana Reeve died.\tChristopher Reeve had an accident.\tnot_entailment"],
    "test.tsv": ["index\tsentence1\tsentence2", "0\tMangla was hit.\tMangla was hit too."],
}
WNLI = {
    "train.tsv": ["index\tsentence1\tsentence2\tlabel",
                  "0\tI stuck a pin through a carrot. When I pulled the pin out, it had a hole.\tThe carrot had a hole.\t1",
                  "1\tJohn couldn't see the stage with Billy in front of him because he is so short.\tJohn is so short.\t1",
                  "2\tThe police arrested all of the gang members.\tThe police were trying to stop the drug trade.\t0"],
    "dev.tsv": ["index\tsentence1\tsentence2\tlabel", "0\tThe drain is clogged with hair.\tThe hair has to be cleaned.\t0"],
    "test.tsv": ["index\tsentence1\tsentence2", "0\tMaude and Dora had seen the trains.\tHorses ran away."],
}
GLUE = {"CoLA": COLA, "SST-2": SST2, "MRPC": MRPC, "STS-B": STSB, "QQP": QQP, "MNLI": MNLI,
        "QNLI": QNLI, "RTE": RTE, "WNLI": WNLI}


@pytest.fixture
def glue(tmp_path):
  return {name: _dir(str(tmp_path / "glue_data"), name, files) for name, files in GLUE.items()}


def test_cola_headerless_train_and_labelled_test(glue):
  t = tasks.load_task(glue["CoLA"])
  assert (t.name, t.kind, t.labels, t.metric_names) == ("cola", "classification", ("0", "1"), ("mcc",))
  assert t.splits["train"] == [
      Example("Our friends won't buy this analysis, let alone the next one we propose.", None, 1),
      Example('The more we study verbs, the "crazier they get.', None, 0)]  # QUOTE_NONE
  assert [e.label for e in t.splits["dev"]] == [1, 0]
  assert t.splits["test"] == [Example("Bill whistled past the house.", None, None),
                              Example("The car honked its way down the road.", None, None)]
  assert tasks.inputs(t.splits["dev"]) == ["Fred watered the plants flat.", "They drank the pub."]


def test_single_sentence_and_pair_tasks(glue):
  sst = tasks.load_task(glue["SST-2"])
  assert sst.splits["train"][2] == Example("that loves its characters ", None, 1)
  assert sst.splits["test"] == [Example("uneasy mishmash of styles and genres .", None, None)]
  mrpc = tasks.load_task(glue["MRPC"])  # train.tsv starts with a byte order mark
  assert mrpc.metric_names == ("f1", "accuracy")
  assert mrpc.splits["train"][0] == Example(
      "Amrozi accused his brother .", "Referring to him , Amrozi accused his brother .", 1)
  assert mrpc.splits["dev"][0].text_a == 'He said "foo" .'
  assert mrpc.splits["test"][0] == Example("PCCW 's chief .", "Common chief .", None)
  qqp = tasks.load_task(glue["QQP"])
  assert qqp.metric_names == ("f1", "accuracy") and [e.label for e in qqp.splits["train"]] == [0, 1]
  assert qqp.splits["test"][0] == Example("Would the idea work?", "Could the idea work?", None)
  qnli = tasks.load_task(glue["QNLI"])
  assert qnli.labels == ("entailment", "not_entailment")
  assert qnli.splits["train"][0] == Example("When did the third Digimon series begin?",
                                            "Unlike the two seasons before it.", 1)
  rte, wnli = tasks.load_task(glue["RTE"]), tasks.load_task(glue["WNLI"])
  assert rte.name == "rte" and rte.splits["dev"][0].label == rte.labels.index("not_entailment")
  assert wnli.name == "wnli" and [e.label for e in wnli.splits["train"]] == [1, 1, 0]
  assert tasks.inputs(rte.splits["test"]) == [("Mangla was hit.", "Mangla was hit too.")]
  for t in (sst, qnli, rte, wnli):
    assert t.metric_names == ("accuracy",) and t.eval_splits == ("dev",)


def test_stsb_float_scores_are_a_regression(glue):
  t = tasks.load_task(glue["STS-B"])
  assert (t.kind, t.labels, t.num_classes) == ("regression", (), 1)
  assert t.metric_names == ("pearson", "spearman")
  assert [e.label for e in t.splits["train"]] == [5.0, 3.8]
  assert t.splits["dev"][1] == Example("A young child is riding a horse.",
                                       "A child is riding a horse.", 4.75)
  assert t.splits["test"][0].label is None


def test_mnli_has_two_dev_and_two_test_files(glue):
  t = tasks.load_task(glue["MNLI"])
  assert t.labels == ("contradiction", "entailment", "neutral")
  assert t.eval_splits == ("dev_matched", "dev_mismatched")
  assert set(t.splits) == {"train", "dev_matched", "dev_mismatched", "test_matched",
                           "test_mismatched"}
  assert [e.label for e in t.splits["train"]] == [2, 1, 0]
  assert t.splits["dev_matched"] == [Example(  # 16 columns: gold_label after five labels
      "The new rights are nice enough", "Everyone really likes the newest benefits ", 2)]
  assert [e.label for e in t.splits["dev_mismatched"]] == [0, 0]
  assert t.splits["dev_mismatched"][1].text_a == 'The answer is "yes".'
  assert t.splits["test_matched"][0].label is None


def test_glue_task_is_recognised_by_header_or_found_under_data_dir(tmp_path):
  d = _dir(str(tmp_path), "my_copy", MNLI)
  assert tasks.load_task(d).name == "mnli"
  assert tasks.load_task(_dir(str(tmp_path), "x", COLA)).name == "cola"
  _dir(str(tmp_path), "glue_data/QQP", QQP)
  assert tasks.load_task("glue_data/QQP", data_dir=str(tmp_path)).name == "qqp"


def test_test_split_is_optional(tmp_path):
  files = {k: v for k, v in RTE.items() if k != "test.tsv"}
  assert set(tasks.load_task(_dir(str(tmp_path), "RTE", files)).splits) == {"train", "dev"}


# --- plain task directories ---


def test_plain_classification_with_pairs_and_unlabelled_test(tmp_path):
  d = _dir(str(tmp_path), "mytask", {
      "train.tsv": ["label\ttext\ttext_b", "10\ta b\tc", "2\td\te", "10\tf\tg"],
      "dev.tsv": ["label\ttext\ttext_b", "2\th\ti"],
      "test.tsv": ["text\ttext_b", "j\tk"]})
  t = tasks.load_task(d)
  assert (t.name, t.kind, t.labels) == ("mytask", "classification", ("2", "10"))  # numeric order
  assert t.splits["train"] == [Example("a b", "c", 1), Example("d", "e", 0), Example("f", "g", 1)]
  assert t.splits["dev"] == [Example("h", "i", 0)]
  assert t.splits["test"] == [Example("j", "k", None)]
  assert t.metric_names == ("accuracy",)


def test_a_train_split_of_one_class_is_refused_in_one_line(tmp_path):
  # A 1-output head would train at loss 0 and report accuracy 1.0 on anything.
  d = _dir(str(tmp_path), "oneclass", {
      "train.tsv": ["label\ttext", "yes\ta", "yes\tb"], "dev.tsv": ["label\ttext", "yes\tc"]})
  with pytest.raises(TaskError, match=r"oneclass: its train split has 1 class \('yes'\); "
                     "expected examples of at least two classes"):
    tasks.load_task(d)


def test_a_tiny_dev_split_is_one_warning_with_its_resolution(tmp_path, capsys):
  d = _dir(str(tmp_path), "tinydev", {
      "train.tsv": ["label\ttext", "yes\ta", "no\tb"], "dev.tsv": ["label\ttext", "yes\tc"]})
  tasks.load_task(d)
  assert capsys.readouterr().err.splitlines() == [
      "warning: task tinydev: dev has 1 example(s), so its accuracy moves in steps of 1.00 "
      f"(± 0.50 at best); expected at least {tasks.SMALL_DEV}"]


def test_a_5_mib_field_is_read_whole(tmp_path):
  # The csv module's 128 KiB field limit made this "field larger than field limit".
  long = "word " * (1 << 20)
  d = _dir(str(tmp_path), "long", {
      "train.tsv": ["label\ttext", f"yes\t{long}", "no\tb"], "dev.tsv": ["label\ttext", "no\tc"]})
  assert tasks.load_task(d).splits["train"][0].text_a.strip() == long.strip()


def test_plain_word_labels_and_a_labelled_test_file(tmp_path):
  d = _dir(str(tmp_path), "sent", {
      "train.tsv": ["label\ttext", "pos\tgood", "neg\tbad"], "dev.tsv": ["label\ttext", "pos\tfine"],
      "test.tsv": ["label\ttext", "neg\tawful"]})
  t = tasks.load_task(d)
  assert t.labels == ("neg", "pos") and t.splits["test"] == [Example("awful", None, None)]


def test_plain_non_integer_labels_make_a_regression(tmp_path):
  d = _dir(str(tmp_path), "scores", {
      "train.tsv": ["label\ttext", "1\ta", "0.5\tb", "3\tc"], "dev.tsv": ["label\ttext", "2\td"]})
  t = tasks.load_task(d)
  assert (t.kind, t.metric_names) == ("regression", ("pearson", "spearman"))
  assert [e.label for e in t.splits["train"]] == [1.0, 0.5, 3.0]
  d = _dir(str(tmp_path), "ints", {
      "train.tsv": ["label\ttext", "1\ta", "0\tb"], "dev.tsv": ["label\ttext", "1\td"]})
  assert tasks.load_task(d).kind == "classification"


# --- TFDS ---


def _toy_glue_tfds(data_dir):
  """A TFDS builder named glue with a cola config, built as array_record (no download)."""
  tfds = pytest.importorskip("tensorflow_datasets")

  class Glue(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("2.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="cola")]

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
      return None

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          "sentence": tfds.features.Text(), "idx": tfds.features.Scalar(dtype=np.int32),
          "label": tfds.features.ClassLabel(names=["unacceptable", "acceptable"])}),
                                   disable_shuffling=True)

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples([("a good one", 1), ("one bad", 0)]),
              "validation": self._generate_examples([("fine", 1)]), "test": self._generate_examples([("hidden", -1)])}

    def _generate_examples(self, rows):
      for i, (s, l) in enumerate(rows):
        yield i, {"sentence": s, "idx": i, "label": l}

  Glue(config="cola", data_dir=str(data_dir), file_format="array_record").download_and_prepare(
      download_config=tfds.download.DownloadConfig(
          compute_stats=tfds.download.ComputeStatsMode.SKIP))


def test_tfds_glue_task_read_from_a_built_data_dir(tmp_path):
  _toy_glue_tfds(tmp_path)
  t = tasks.load_task("tfds:glue/cola", data_dir=str(tmp_path))
  assert (t.name, t.labels, t.metric_names) == ("cola", ("unacceptable", "acceptable"), ("mcc",))
  assert t.splits["train"] == [Example("a good one", None, 1), Example("one bad", None, 0)]
  assert t.splits["dev"] == [Example("fine", None, 1)]
  assert t.splits["test"] == [Example("hidden", None, None)]


def test_tfds_records_map_glue_features():
  recs = [{"question1": b"q a", "question2": b"q b", "label": 1, "idx": 0}]
  assert tasks_tfds.tfds_examples(recs, "classification", "x") == [Example("q a", "q b", 1)]
  recs = [{"premise": b"p", "hypothesis": b"h", "label": -1, "idx": 0}]
  assert tasks_tfds.tfds_examples(recs, "classification", "x") == [Example("p", "h", None)]
  recs = [{"question": b"q", "sentence": b"s", "label": 0, "idx": 0}]
  assert tasks_tfds.tfds_examples(recs, "classification", "x") == [Example("q", "s", 0)]
  recs = [{"sentence1": b"a", "sentence2": b"b", "label": 3.2, "idx": 0}]
  assert tasks_tfds.tfds_examples(recs, "regression", "x") == [Example("a", "b", 3.2)]


def test_tfds_task_not_built_is_one_line_and_never_downloads(tmp_path):
  with pytest.raises(TaskError) as e:
    tasks.load_task("tfds:glue/rte", data_dir=str(tmp_path))
  msg = str(e.value)
  assert "\n" not in msg and "glue/rte" in msg and "tfds build" in msg and str(tmp_path) in msg
  assert os.listdir(tmp_path) == []
  with pytest.raises(TaskError, match="expected tfds:glue/<task>"):
    tasks.load_task("tfds:glue/squad")


# --- bad input: one line naming the file (and line) and what was expected ---


def _replace(files, name, lines):
  return {**files, name: lines}


BAD = {
    "missing column": ("QNLI", _replace(QNLI, "dev.tsv", ["index\tquestion\tlabel", "0\tq\tentailment"]),
                       ["dev.tsv", "no column 'sentence'", "index<TAB>question<TAB>sentence<TAB>label"]),
    "short row": ("RTE", _replace(RTE, "train.tsv", RTE["train.tsv"] + ["2\tonly one sentence"]),
                  ["train.tsv", "line 4", "2 tab-separated fields", "expected 4"]),
    "cola header in train": ("CoLA", _replace(COLA, "train.tsv", ["sentence\tlabel", "a\t1"]),
                             ["train.tsv", "line 1", "expected 4", "headerless"]),
    "label not in the task's set": ("SST-2", _replace(SST2, "dev.tsv", ["sentence\tlabel", "x\t2"]),
                                    ["dev.tsv", "line 2", "label '2'", "0, 1"]),
    "mnli gold label missing": ("MNLI", _replace(MNLI, "dev_mismatched.tsv", [MNLI_HEAD + "\tlabel1"]),
                                ["dev_mismatched.tsv", "gold_label"]),
    "mnli second dev file missing": ("MNLI", {k: v for k, v in MNLI.items() if k != "dev_mismatched.tsv"},
                                     ["dev_mismatched.tsv", "does not exist"]),
    "empty dev": ("WNLI", _replace(WNLI, "dev.tsv", []), ["dev.tsv", "empty"]),
    "header only": ("QQP", _replace(QQP, "dev.tsv", QQP["dev.tsv"][:1]), ["dev.tsv", "no examples"]),
    "bad float": ("STS-B", _replace(STSB, "train.tsv", STSB["train.tsv"][:2] + [
        STSB["train.tsv"][2].rsplit("\t", 1)[0] + "\tthree"]),
                  ["train.tsv", "line 3", "'three'", "float"]),
    "missing train": ("MRPC", {k: v for k, v in MRPC.items() if k != "train.tsv"},
                      ["no train.tsv"]),
    "plain dev label unseen in train": ("plain", {"train.tsv": ["label\ttext", "a\tx", "b\ty"],
                                                  "dev.tsv": ["label\ttext", "c\tz"]},
                                        ["dev.tsv", "line 2", "label 'c'", "train labels"]),
    "plain regression bad float in dev": ("plain", {"train.tsv": ["label\ttext", "0.5\tx"],
                                                    "dev.tsv": ["label\ttext", "1.5\tz", "nan\tw"]},
                                          ["dev.tsv", "line 3", "'nan'"]),
    "plain missing dev": ("plain", {"train.tsv": ["label\ttext", "a\tx"]}, ["no dev.tsv"]),
    "plain dev without text_b": ("plain", {"train.tsv": ["label\ttext\ttext_b", "a\tx\ty"],
                                           "dev.tsv": ["label\ttext", "a\tz"]},
                                 ["dev.tsv", "label<TAB>text<TAB>text_b"]),
    "plain extra field": ("plain", {"train.tsv": ["label\ttext", "a\tx\ty"],
                                    "dev.tsv": ["label\ttext", "a\tz"]},
                          ["train.tsv", "line 2", "3 tab-separated fields"]),
    "unknown header": ("mine", {"train.tsv": ["text\tcategory", "x\ta"]},
                       ["train.tsv", "text<TAB>category", "label<TAB>text"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_task_error_naming_the_file(case, tmp_path):
  name, files, words = BAD[case]
  d = _dir(str(tmp_path), name, files)
  os.makedirs(d, exist_ok=True)
  with pytest.raises(TaskError) as e:
    tasks.load_task(d)
  msg = str(e.value)
  assert "\n" not in msg and d in msg, msg
  for w in words:
    assert w in msg, msg


def test_not_utf8_names_the_line(tmp_path):
  d = _dir(str(tmp_path), "plain", {"dev.tsv": ["label\ttext", "a\tz"]})
  with open(os.path.join(d, "train.tsv"), "wb") as f:
    f.write(b"label\ttext\na\tok\nb\tbad \xff\n")
  with pytest.raises(TaskError, match=r"train.tsv: line 3 is not UTF-8"):
    tasks.load_task(d)


def test_unknown_task_names_the_choices(tmp_path):
  with pytest.raises(TaskError, match=r"'nope': no such directory.*word_order"):
    tasks.load_task("nope")


# --- the shipped word_order task ---


def _unswap(a, b):
  """True when b is a with exactly one adjacent pair of different words swapped."""
  a, b = a.split(), b.split()
  diff = [i for i in range(len(a)) if i >= len(b) or a[i] != b[i]]
  return (len(a) == len(b) and len(diff) == 2 and diff[1] == diff[0] + 1
          and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])


def test_word_order_is_balanced_split_by_sentence_and_swaps_one_adjacent_pair():
  from bert_jax.eval import word_order
  t = tasks.load_task("word_order")
  sentences = word_order.read_sentences()
  assert len(sentences) >= 400 and (t.name, t.labels) == ("word_order", ("original", "swapped"))
  assert t.metric_names == ("accuracy",) and t.eval_splits == ("dev",)
  originals = set(sentences)
  seen = {}
  for split in ("train", "dev"):
    ex = t.splits[split]
    assert abs(sum(e.label for e in ex) - len(ex) / 2) <= 0.5  # majority baseline 0.5
    for e in ex:
      if e.label == 0:
        source = e.text_a
        assert source in originals
      else:
        assert e.text_a not in originals  # never identical to a sentence
        (source,) = [s for s in sentences if _unswap(s, e.text_a)]
      assert source not in seen, "a sentence is used twice"
      seen[source] = split
  assert len(t.splits["dev"]) == round(0.3 * len(sentences)) and len(seen) == len(sentences)
  # A pure function of the text and the seed.
  assert word_order.build(sentences) == t
  assert word_order.build(sentences, seed=1) != t


def test_word_order_leaves_out_what_cannot_be_swapped_and_repeats():
  from bert_jax.eval import word_order
  t = word_order.build(["a b c", "x x x", "one", "a b c"] + [f"w{i} v{i}" for i in range(8)])
  texts = [e.text_a for s in t.splits.values() for e in s]
  assert len(texts) == 9 and not {"x x x", "one"} & set(texts)


def test_heldout_text_shares_no_sentence_with_the_corpus():
  from bert_jax.eval import word_order
  corpus = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                        "corpus.txt")
  with open(corpus, encoding="utf-8") as f:
    lines = {" ".join(l.split()) for l in f}
  assert not lines & set(word_order.read_sentences())


def test_task_data_side_imports_no_jax():
  import json
  import subprocess
  import sys
  code = ("import json, sys\nfrom bert_jax.eval import metrics, tasks, tasks_tfds, word_order\n"
          "tasks.load_task('word_order')\nprint(json.dumps(sorted(sys.modules)))")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-c", code], cwd=repo, check=True, capture_output=True,
                       text=True).stdout
  loaded = json.loads(out.strip().splitlines()[-1])
  assert not [m for m in loaded if m.split(".")[0] in ("jax", "flax", "optax", "tensorflow_datasets")]
