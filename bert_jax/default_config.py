"""Default config: BERT-Base pre-training as in the reference (Devlin et al. 2018).

The configs in `configs/` derive from `get_config()` here and change only what differs.
Override any field from the command line: `--config.train.batch_size=32`.
"""

import os

import ml_collections


def cache_dir(name: str) -> str:
  """`<cache home>/bert_jax/<name>`, unexpanded: $XDG_CACHE_HOME where set (the tests set
  it to a folder of their own, not the user's), else ~/.cache."""
  return os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "bert_jax", name)


def get_config() -> ml_collections.ConfigDict:
  """The default: one section per part of a run, each field with its comment."""
  c = ml_collections.ConfigDict()
  c.seed = 0  # seed of initialisation, masking, dropout and data order
  # What the model learns besides masked-LM: 'mlm+nsp' (the reference: next
  # sentence prediction), 'mlm' (RoBERTa: one segment of consecutive sentences
  # of one document, no second task), 'mlm+sop' (ALBERT: sentence-order
  # prediction, A and B from one document, swapped half the time). Changes the
  # prepared examples and the loss.
  c.objective = "mlm+nsp"  # pre-training tasks: mlm+nsp | mlm | mlm+sop
  # Continue a published BERT: a HuggingFace directory, a google-research TF
  # checkpoint directory, a bert_jax.io.convert checkpoint or a bert-jax workdir
  # (or PATH/checkpoints/<step>). Its model shape, vocabulary and lowercasing win.
  c.init_from = ""  # '' = start from scratch; else the model to continue from
  c.data = _data()
  c.masking = _masking()
  c.eval = ml_collections.ConfigDict()
  # Evaluation masks at one fixed rate whatever the training rate, as ModernBERT, Ettin and
  # mmBERT report MLM at 15%; 0 = the phase's training rate (its last, for a ramp).
  c.eval.mask_prob = 0.15
  c.model = _model()
  c.train = _train()
  c.mesh = _mesh()
  c.probe = _probe()
  # Profiles (jax.profiler) into <workdir>/tensorboard: the steps given, and the next
  # on_demand_steps steps whenever a file <workdir>/PROFILE appears (docs/training.md).
  c.profile = ml_collections.ConfigDict()
  c.profile.steps = ()  # (start, end), e.g. (1000, 1010); () = none planned
  c.profile.on_demand_steps = 5  # steps traced after `touch <workdir>/PROFILE`
  # --- bookkeeping: logging, evaluation and checkpoint cadence, compile cache ---
  c.log_every = 100  # steps between train metrics and throughput lines
  c.eval_every = 10_000  # steps between evaluations
  c.eval_batches = 0  # 0 = whole eval split
  c.checkpoint_every = 10_000  # steps between checkpoints
  c.keep_checkpoints = 3  # newest checkpoints kept
  c.progress_bar = True  # show a progress bar in the terminal
  # <workdir>/training_curves.png at the end (matplotlib: about 2.5 s of a CPU core; the
  # same curves are in TensorBoard and metrics.jsonl).
  c.plot = True
  # JAX's persistent compilation cache: a repeated or resumed run skips compiling.
  c.compile_cache_dir = cache_dir("xla")  # compiled-step cache folder ('' = off)
  # A hang: no step completes for this many seconds (compiles, evals and saves left out):
  # every thread's stack goes to <workdir>/hang-*.txt, with one line on stderr.
  c.watchdog_s = 0.0  # seconds, far above a step's time (e.g. 1800); 0 = off
  c.watchdog_exit = False  # then exit with status 3, for a scheduler to restart the run
  # On a pod: a process waiting for its input more than this many times the median
  # process (and 10% of a step) is named at the log points (train/stragglers). 0 = off.
  c.straggler_factor = 3.0
  return c


def _data() -> ml_collections.ConfigDict:
  """Data: text -> WordPiece -> sentence-pair examples (stored once via TFDS)."""
  c = ml_collections.ConfigDict()
  # 'builtin' (CPython's pydoc topics, always present); a file, folder or glob, local or
  # gs://, of text (plain: one sentence per line, blank line between documents; tab:
  # `A<TAB>B` per line), JSONL or Parquet (a record a document), any of them gzip, zstd,
  # bzip2 or xz compressed (docs/corpora.md); or 'tfds:<name>:<feature>'.
  c.corpus = "builtin"
  c.format = "auto"  # 'auto' | 'plain' | 'tab' | 'jsonl' | 'parquet'
  c.field = "text"  # the text field of JSONL records, the text column of Parquet files
  # A mixture instead of one corpus: ('NAME=SPEC[,weight=W][,field=F][,format=X]', ...),
  # each source prepared on its own with one shared vocabulary, and the rows of every
  # batch drawn so that source i gives a share p_i ∝ weight_i * tokens_i ** temperature
  # of the tokens (data/mixture.py, docs/corpora.md).
  c.sources = ()
  c.temperature = 0.0  # a mixture's p_i ∝ weight_i * tokens_i ** temperature (0: the weights)
  # A mixture per phase (a stage's data): the sources' weights in each phase, e.g.
  # ((0.7, 0.3), (0.5, 0.5)), and each phase's temperature, e.g. (0.7, 0.5, 0.3)
  # (mmBERT's annealing); () = the weights in data.sources and data.temperature.
  c.phase_weights = ()
  c.phase_temperatures = ()  # each phase's temperature; () = data.temperature throughout
  # '' = train a vocabulary on the corpus; a vocab.txt (WordPiece) or a HuggingFace
  # tokenizer.json (BPE, e.g. a published ModernBERT's: its own normalizer decides casing).
  c.vocab_file = ""
  c.tokenizer = "wordpiece"  # what a trained vocabulary is: 'wordpiece' | 'bpe' (byte-level)
  c.vocab_size = 30522  # target size when training a vocab
  c.vocab_sample_bytes = 100_000_000  # a trained vocab learns from this much text
  c.lowercase = True  # lowercase the text (an uncased model)
  c.short_seq_prob = 0.1  # chance that an example gets a shorter target length (as BERT)
  c.dupe_factor = 5  # passes over the corpus, each with fresh pairs
  # More passes over a small eval split make an accuracy's noise smaller (fresh NSP pairs
  # and split points each pass; the masks differ per example too).
  c.eval_dupe_factor = 0  # passes over the eval documents; 0 = data.dupe_factor
  c.eval_fraction = 0.05  # of documents held out for evaluation
  c.max_eval_examples = 2048  # cap on the examples of the eval split
  c.max_documents = 0  # 0 = all (useful to cap TFDS corpora)
  c.num_workers = 0  # processes preparing the data; 0 = this host's usable cores
  # Example streams: batch = one sub-batch per stream (parts p % streams), each its own
  # shuffle. Host-local caches: a multiple of the process count (docs/training.md).
  c.streams = 1
  # With objective 'mlm': several documents' spans per row, attention kept inside each
  # document (data/packing.py); far less padding on short documents.
  c.packing = False
  c.extend_vocab = 0  # with init_from: add up to N whole words of the corpus as new WordPieces
  c.cache_dir = ""  # '' = <workdir>/prepared; prepared data is reused from here
  return c


def _masking() -> ml_collections.ConfigDict:
  """Masking (done on device inside the jitted step)."""
  c = ml_collections.ConfigDict()
  c.mask_prob = 0.15  # fraction of tokens predicted (80% [MASK], 10% random, 10% kept)
  c.whole_word = False  # mask all word pieces of a word together
  return c


def _model() -> ml_collections.ConfigDict:
  """Model."""
  c = ml_collections.ConfigDict()
  # 'bert' (the 2018 model, bit for bit) or 'modernbert' (transformers' ModernBertModel:
  # RoPE, GeGLU, pre-norm, alternating global and sliding-window attention; objective
  # 'mlm'; configs/modernbert_base.py). docs/modernbert.md.
  c.family = "bert"
  c.hidden_size = 768  # width of every layer
  c.num_layers = 12  # transformer layers
  c.num_heads = 12  # attention heads (must divide hidden_size)
  c.intermediate_size = 3072  # feed-forward width
  c.max_position_embeddings = 512  # longest sequence the model can take
  c.type_vocab_size = 2  # segment types (sentence A and B)
  c.dropout_rate = 0.1  # dropout on hidden states
  c.attention_dropout_rate = 0.1  # dropout on attention probabilities
  c.layer_norm_eps = 1e-12  # LayerNorm epsilon
  c.initializer_range = 0.02  # stddev of the truncated-normal initialiser
  c.gelu_approximate = False  # reference BERT uses exact (erf) GELU
  c.vocab_pad_multiple = 128  # pad the embedding table for fast matmuls
  # Compute dtype: 'auto' = bfloat16 mixed precision (bf16 operands, float32
  # accumulation) on TPU, GPU and CPUs with native bf16 dots, float32 elsewhere;
  # or 'float32' | 'bfloat16' | 'float16'. Params, LayerNorm, softmax, loss: float32.
  c.dtype = "auto"  # compute dtype: auto | float32 | bfloat16 | float16
  c.remat = False  # recompute activations in the backward pass (less memory, more time)
  # With remat: 'full' keeps only each layer's input; 'save_dots' also keeps its six
  # weight-matmul outputs and recomputes only attention scores/softmax and elementwise work.
  c.remat_policy = "full"
  # Dropout's random bits: 'hash' (a keyed counter hash, cheap), 'threefry'
  # (JAX's default generator), or 'rbg' / 'unsafe_rbg' (XLA's RngBitGenerator).
  # Same keep probability either way.
  c.dropout_rng = "hash"
  # Float32 attention dots on XLA:CPU: 'canonical' (batch and head axes first, the
  # contraction last; faster there) or 'xla' (XLA picks). Same values either way.
  c.cpu_attention_layout = "canonical"
  # The attention core: 'einsum' (the model's dots, with attention dropout), 'jax'
  # (jax.nn.dot_product_attention, XLA), 'cudnn' (its cuDNN fused kernel, NVIDIA GPUs),
  # 'splash' (Pallas splash attention, TPUs) or 'auto' ('splash' on a TPU when there is
  # no attention dropout, every length is a multiple of 128 and the longest is 512 or
  # more, where it needs less memory; else 'einsum').
  # All but 'einsum' have no attention dropout: set attention_dropout_rate=0 with them.
  c.attention_kernel = "einsum"
  # Where the 'einsum' core normalizes the softmax: 'standard' (the probabilities, before
  # the context dot: the reference order) or 'deferred' (the context, after it, as fused
  # kernels do). Same values; 'deferred' is a lever to measure (docs/performance.md).
  c.attention_softmax = "standard"
  # Dots of forward-only programs (features, probes) on XLA:CPU: 'auto' (float32: 'eigen',
  # XLA's own dots, faster there; mixed: 'ynnpack', XLA's library fusions), 'ynnpack' or
  # 'eigen'. Training steps always keep XLA's default. Same values either way.
  c.cpu_forward_dots = "auto"
  # family='modernbert' only (transformers' ModernBertConfig names and defaults).
  c.global_rope_theta = 160000.0  # RoPE base of the global-attention layers
  c.local_rope_theta = 10000.0  # RoPE base of the sliding-window layers
  c.local_attention = 128  # a local layer attends to keys within local_attention // 2
  c.global_attn_every_n_layers = 3  # layers 0, n, 2n, ... are global, the rest local
  c.attention_bias = False  # biases of Wqkv and Wo
  c.mlp_bias = False  # biases of Wi and Wo
  c.norm_bias = False  # LayerNorm biases
  c.decoder_bias = True  # the MLM decoder's bias
  c.classifier_bias = False  # the MLM head's dense bias
  return c


# long: one line per field of config.train, each with its meaning beside it
def _train() -> ml_collections.ConfigDict:
  """Optimization."""
  c = ml_collections.ConfigDict()
  c.batch_size = 256  # global, across all devices and hosts
  c.num_steps = 1_000_000  # optimizer steps over all phases
  c.learning_rate = 1e-4  # peak, after warm-up; then the schedule's decay
  c.warmup_steps = 10_000  # linear warm-up from 0 over this many steps
  # After the warm-up: 'linear' (the reference: lr*(1 - step/num_steps)), 'cosine' (to
  # min_lr_ratio*lr at num_steps), 'wsd' (the peak until the last decay_fraction of the
  # steps, then decay_shape down to min_lr_ratio*lr; raise num_steps on resume to extend
  # it), 'inverse_sqrt' (lr*sqrt(warmup_steps/step)). docs/training.md#recipe-options.
  c.schedule = "linear"  # linear | cosine | wsd | inverse_sqrt
  c.decay_fraction = 0.1  # wsd: the final share of num_steps that decays
  c.decay_shape = "linear"  # wsd: linear | cosine | sqrt (1 - sqrt(t), MiniCPM's)
  c.min_lr_ratio = 0.0  # cosine and wsd end at this share of the peak
  c.b1 = 0.9  # Adam beta1
  c.b2 = 0.999  # Adam beta2
  c.eps = 1e-6  # Adam epsilon
  c.weight_decay = 0.01  # decoupled weight decay (not on biases and LayerNorm)
  c.max_grad_norm = 1.0  # clip the global gradient norm to this (0 = no clipping)
  # 'adamw' (the reference) or 'lamb' (You et al. 2019, NVIDIA's and MLPerf's
  # large-batch BERT: Adam scaled per parameter by ||w|| / ||update||). Same
  # decay mask, schedule and clipping; a run cannot resume with the other one.
  c.optimizer = "adamw"  # adamw | lamb
  c.grad_accum_steps = 1  # micro-batches per step (same result, less memory)
  # A step whose loss or gradient is NaN/inf is skipped (changes nothing);
  # this many in a row stop the run with an error.
  c.max_consecutive_nonfinite = 10
  # A finite loss spike: when the loss exceeds factor x its running mean (over `window`
  # steps) for `patience` steps in a row, restore the newest checkpoint before the spike
  # and skip the batches since it; after `max_rollbacks` the run stops. 0 = off.
  c.spike_rollback = ml_collections.ConfigDict()
  c.spike_rollback.factor = 0.0  # e.g. 3.0; 0 = off
  c.spike_rollback.patience = 3  # spiking steps in a row that trigger a rollback
  c.spike_rollback.window = 100  # steps of the running mean (none judged before it fills)
  c.spike_rollback.max_rollbacks = 3  # then stop with one line
  # Batch-size warm-up: the global batch starts at `start` and grows to batch_size over
  # `steps` steps, in `stages` sizes (multiples of the data-parallel width; each size
  # compiles once). Data position and learning rate follow the step. 0 = off.
  c.batch_ramp = ml_collections.ConfigDict()
  c.batch_ramp.start = 0  # the global batch at step 0, e.g. 32; 0 = off
  c.batch_ramp.steps = 0  # steps until batch_size
  c.batch_ramp.stages = 4  # sizes below batch_size, each held steps / stages steps
  # Two-phase sequence length: fraction of steps, max length, max predictions.
  c.phase_fractions = (0.9, 0.1)  # fraction of num_steps in each phase
  c.seq_lens = (128, 512)  # sequence length of each phase
  c.max_predictions = (20, 80)  # masked positions per sequence in each phase
  # ModernBERT's context extension inside one run: the global layers' RoPE base in each
  # phase, e.g. (10000, 160000) with seq_lens (1024, 8192); () = model.global_rope_theta.
  c.phase_rope_thetas = ()
  # The masking rate of each phase: a rate, or (start, end), a linear ramp over the phase
  # (Ankner et al. 2023: 30% -> 15%), e.g. ((0.3, 0.15), 0.05); () = masking.mask_prob.
  c.phase_mask_probs = ()
  # The global batch of each phase, e.g. (768, 576): a long-context stage trains fewer,
  # longer rows; () = batch_size in every phase. batch_ramp warms up the first phase's.
  c.phase_batch_sizes = ()
  # Each phase's budget, instead of phase_fractions of num_steps: exact steps, e.g.
  # (8000, 2000); or tokens (rows x length per step at the phase's batch), e.g.
  # ('1.7T', '250B', '50B'). num_steps is then their sum. () = phase_fractions.
  c.phase_steps = ()  # each phase's exact steps; () = phase_fractions of num_steps
  c.phase_tokens = ()  # each phase's tokens (e.g. '250B'); () = phase_fractions of num_steps
  # Per phase, whether Adam's moments start afresh at its first step (the learning-rate
  # schedule and the counts of skipped steps go on), e.g. (False, False, True); () = never.
  c.phase_reset_optimizer = ()
  # Per phase, the decay of an exponential moving average of the parameters, started
  # afresh at the phase's first step (0: none in that phase), e.g. (0, 0, 0.999) for the
  # decay stage; () = none. Read it with `python -m bert_jax.merge OUT WORKDIR --ema`.
  c.phase_ema = ()
  # schedule='phases': one learning-rate segment per phase, 'KIND[@LR][->RATIO]': e.g.
  # ('constant', 'constant@3e-4', 'sqrt->0.001'), ModernBERT's three stages.
  c.phase_lr = ()
  return c


def _mesh() -> ml_collections.ConfigDict:
  """Parallelism: a (data, model) mesh over all devices of all hosts."""
  c = ml_collections.ConfigDict()
  c.model_parallel = 1  # devices on the 'model' axis; the rest do data parallel
  c.param_sharding = "replicated"  # 'replicated' | 'fsdp' (params sharded over data)
  return c


def _probe() -> ml_collections.ConfigDict:
  """Downstream: linear probes of the current parameters at every evaluation."""
  c = ml_collections.ConfigDict()
  # On by default: every run shows a downstream curve beside its MLM curve (the shipped
  # word_order task costs a few percent of an evaluation; `--config.probe.tasks=()` turns it off).
  c.tasks = ("word_order",)  # shipped names, GLUE / plain task dirs (bert_jax.eval.tasks)
  c.layers = (-1,)  # hidden states probed (-1 = last layer; several are concatenated)
  c.pooling = "mean"  # 'mean', 'cls' or 'pooler'
  c.max_examples = 0  # per split, a seeded subset; 0 = every example
  c.data_dir = ""  # where relative task dirs and tfds:glue/<task> are looked up
  return c
