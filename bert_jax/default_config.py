"""Default config: BERT-Base pre-training as in the reference (Devlin et al. 2018).

The configs in `configs/` derive from `get_config()` here and change only what differs.
Override any field from the command line: `--config.train.batch_size=32`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # What the model learns besides masked-LM: 'mlm+nsp' (the reference: next
  # sentence prediction), 'mlm' (RoBERTa: one segment of consecutive sentences
  # of one document, no second task), 'mlm+sop' (ALBERT: sentence-order
  # prediction, A and B from one document, swapped half the time). Changes the
  # prepared examples and the loss.
  c.objective = "mlm+nsp"

  # --- data: text -> WordPiece -> sentence-pair examples (stored once via TFDS) ---
  c.data = ml_collections.ConfigDict()
  # 'builtin' (CPython's pydoc topics, always present), a text file path (plain:
  # one sentence per line, blank line between documents; or tab: `A<TAB>B` per
  # line), or 'tfds:<name>:<feature>' e.g. 'tfds:wikipedia/20230601.en:text'.
  c.data.corpus = "builtin"
  c.data.format = "auto"  # 'auto' | 'plain' | 'tab'
  c.data.vocab_file = ""  # '' = train a WordPiece vocab on the corpus
  c.data.vocab_size = 30522  # target size when training a vocab
  c.data.vocab_sample_bytes = 100_000_000  # a trained vocab learns from this much text
  c.data.lowercase = True
  c.data.short_seq_prob = 0.1
  c.data.dupe_factor = 5  # passes over the corpus, each with fresh pairs
  c.data.eval_fraction = 0.05  # of documents held out for evaluation
  c.data.max_eval_examples = 2048
  c.data.max_documents = 0  # 0 = all (useful to cap TFDS corpora)
  c.data.cache_dir = ""  # '' = <workdir>/prepared; prepared data is reused from here

  # --- masking (done on device inside the jitted step) ---
  c.masking = ml_collections.ConfigDict()
  c.masking.mask_prob = 0.15
  c.masking.whole_word = False

  # --- model ---
  c.model = ml_collections.ConfigDict()
  c.model.hidden_size = 768
  c.model.num_layers = 12
  c.model.num_heads = 12
  c.model.intermediate_size = 3072
  c.model.max_position_embeddings = 512
  c.model.type_vocab_size = 2
  c.model.dropout_rate = 0.1
  c.model.attention_dropout_rate = 0.1
  c.model.layer_norm_eps = 1e-12
  c.model.initializer_range = 0.02
  c.model.gelu_approximate = False  # reference BERT uses exact (erf) GELU
  c.model.vocab_pad_multiple = 128  # pad the embedding table for fast matmuls
  c.model.dtype = "bfloat16"  # compute dtype; params, softmax and loss stay float32
  c.model.remat = False
  # Dropout's random bits: 'hash' (a keyed counter hash, cheap) or 'threefry'
  # (JAX's default generator). Same keep probability either way.
  c.model.dropout_rng = "hash"

  # --- optimization ---
  c.train = ml_collections.ConfigDict()
  c.train.batch_size = 256  # global, across all devices and hosts
  c.train.num_steps = 1_000_000
  c.train.learning_rate = 1e-4
  c.train.warmup_steps = 10_000
  c.train.b1 = 0.9
  c.train.b2 = 0.999
  c.train.eps = 1e-6
  c.train.weight_decay = 0.01
  c.train.max_grad_norm = 1.0  # 0 = no clipping
  # 'adamw' (the reference) or 'lamb' (You et al. 2019, NVIDIA's and MLPerf's
  # large-batch BERT: Adam scaled per parameter by ||w|| / ||update||). Same
  # decay mask, schedule and clipping; a run cannot resume with the other one.
  c.train.optimizer = "adamw"
  c.train.grad_accum_steps = 1
  # A step whose loss or gradient is NaN/inf is skipped (changes nothing);
  # this many in a row stop the run with an error.
  c.train.max_consecutive_nonfinite = 10
  # Two-phase sequence length: fraction of steps, max length, max predictions.
  c.train.phase_fractions = (0.9, 0.1)
  c.train.seq_lens = (128, 512)
  c.train.max_predictions = (20, 80)

  # --- parallelism: a (data, model) mesh over all devices of all hosts ---
  c.mesh = ml_collections.ConfigDict()
  c.mesh.model_parallel = 1  # devices on the 'model' axis; the rest do data parallel
  c.mesh.param_sharding = "replicated"  # 'replicated' | 'fsdp' (params sharded over data)

  # --- bookkeeping ---
  c.log_every = 100
  c.eval_every = 10_000
  c.eval_batches = 0  # 0 = whole eval split
  c.checkpoint_every = 10_000
  c.keep_checkpoints = 3
  c.progress_bar = True
  return c
