"""Optax optimizer: AdamW or LAMB, the learning-rate schedule (train/schedules), clipping.

Steps with a non-finite loss or gradient are skipped (`skip_nonfinite`).

Knows nothing of the model: the weight-decay mask comes from parameter names
(no decay on LayerNorm parameters or biases, as in the reference).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from bert_jax.train import schedules

if TYPE_CHECKING:  # settings imports the model; the optimizer does not need it
  from bert_jax.settings import OptimizerSettings


def bert_schedule(learning_rate: float, warmup_steps: int, num_steps: int) -> optax.Schedule:
  """The reference schedule (train/schedules.linear): linear warm-up, then linear decay
  to 0 at `num_steps`, measured from step 0."""
  return schedules.linear(learning_rate, warmup_steps, num_steps)


def decay_mask(params: Any) -> Any:
  """True for parameters that get weight decay: not biases, not LayerNorm.

  As the reference (a regex search of "bias", "LayerNorm", "layer_norm" in the
  parameter name), so the MLM output bias is not decayed either.
  """
  def keep(path, _):
    name = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path).lower()
    # "/norm/": every LayerNorm's own parameters (ModernBERT's attn_norm, mlp_norm, ...;
    # BERT's are all inside a "LayerNorm" module already).
    return not any(s in name for s in ("bias", "layernorm", "layer_norm", "/norm/"))
  return jax.tree_util.tree_map_with_path(keep, params)


def scale_by_stable_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """Adam's update, each tensor's divided by max(1, RMS(g^2 / max(v_hat, eps^2))): the
  update clipping of StableAdamW (Wortsman et al. 2023, arXiv 2304.13013; ModernBERT's
  optimizer), which bounds a tensor's step when its second moment lags a sudden gradient.
  The decoupled weight decay that follows is not rescaled (optimi's is): a deviation
  listed in docs/deviations.md. Its state is Adam's, so it checkpoints like adamw."""
  adam = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

  def update(grads, state, params=None):
    updates, new_state = adam.update(grads, state, params)
    count = new_state.count.astype(jnp.float32)
    nu_hat = jax.tree.map(lambda v: v / (1.0 - b2 ** count), new_state.nu)

    def clipped(u, g, v):
      rms = jnp.sqrt(jnp.mean(jnp.square(g) / jnp.maximum(v, eps * eps)))
      return u / jnp.maximum(1.0, rms)
    return jax.tree.map(clipped, updates, grads, nu_hat), new_state

  return optax.GradientTransformation(adam.init, update)


class SkipNonFiniteState(NamedTuple):
  streak: jax.Array  # int32: consecutive skipped steps, 0 after a good one
  skipped: jax.Array  # int32: skipped steps since the start of training
  inner: Any


class ParamEmaState(NamedTuple):
  count: jax.Array  # int32: the steps applied, as the schedule counts them
  ema: Any  # float32, shaped as the parameters


def param_ema(spans: tuple) -> optax.GradientTransformation:
  """Last in the chain: an exponential moving average of the parameters after each
  step (params + the final updates), which it passes on unchanged. `spans` are (start,
  end, decay) per phase: at a phase's first step the average restarts at the new
  parameters; inside it, ema = decay * ema + (1 - decay) * params (decay 0: the
  parameters, to float32 rounding: the compiled step may round params + updates apart
  from its own update). Its state is checkpointed with the optimizer's, so a resume
  continues it bit for bit."""
  starts = jnp.asarray([s for s, _, _ in spans], jnp.int32)
  decays = jnp.asarray([d for _, _, d in spans], jnp.float32)

  def init(params):
    return ParamEmaState(jnp.zeros([], jnp.int32),
                         jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params))

  def update(updates, state, params=None):
    phase = jnp.clip(jnp.sum(state.count >= starts) - 1, 0, len(spans) - 1)
    decay = jnp.where(state.count == starts[phase], 0.0, decays[phase])
    ema = jax.tree.map(lambda e, p, u: decay * e + (1.0 - decay) * (
        p.astype(jnp.float32) + u.astype(jnp.float32)), state.ema, params, updates)
    return updates, ParamEmaState(state.count + 1, ema)

  return optax.GradientTransformation(init, update)


def reset_moments(state: SkipNonFiniteState, fresh: SkipNonFiniteState) -> SkipNonFiniteState:
  """`state` with every part of its chain taken from `fresh` (a new `init`) but the
  learning-rate schedule's count and the parameters' average (the last one or two):
  Adam's moments and their bias-correction count start afresh; the schedule, the
  average and the counts of skipped steps go on."""
  keep = 2 if isinstance(state.inner[-1], ParamEmaState) else 1
  return state._replace(inner=(*fresh.inner[:-keep], *state.inner[-keep:]))


def ema_of(state: Any) -> Any:
  """The parameters' moving average in an optimizer state (train.phase_ema), else None."""
  inner = getattr(state, "inner", ())
  return inner[-1].ema if inner and isinstance(inner[-1], ParamEmaState) else None


def skip_nonfinite(inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """Wraps `inner` so a step with a non-finite loss or gradient changes nothing.

  Such a step yields zero updates and keeps the inner state (Adam moments,
  counts), so the parameters and optimizer state stay bit for bit as they
  were. Unlike `optax.apply_if_finite` it never gives up and applies a bad
  update: stopping after too many is the caller's decision (it reads `streak`).
  The loss comes in as the extra argument `loss` (optional).
  """
  def init(params):
    zero = jnp.zeros([], jnp.int32)
    return SkipNonFiniteState(zero, zero, inner.init(params))

  def update(grads, state, params=None, *, loss=None, **_):
    finite = [jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]
    if loss is not None:
      finite.append(jnp.all(jnp.isfinite(loss)))
    ok = jnp.all(jnp.stack(finite))
    updates, inner_state = jax.lax.cond(
        ok, lambda: inner.update(grads, state.inner, params),
        lambda: (jax.tree.map(jnp.zeros_like, grads), state.inner))
    bad = 1 - ok.astype(jnp.int32)
    return updates, SkipNonFiniteState(streak=(state.streak + bad) * bad,
                                       skipped=state.skipped + bad, inner=inner_state)

  return optax.GradientTransformationExtraArgs(init, update)


def make_optimizer(train: OptimizerSettings) -> tuple[optax.GradientTransformation, Callable]:
  """Returns (optimizer, learning-rate schedule); the settings were checked when made.

  'adamw' and 'lamb' share the clipping, Adam's moments, the decoupled decay
  with its mask and the schedule; LAMB (You et al. 2019) also rescales each
  parameter's update by the trust ratio ||w|| / ||update||, as `optax.lamb`
  (which applies it to every parameter, decayed or not). Their states differ
  in structure, so a checkpoint resumes only with the optimizer that wrote it.
  """
  schedule = schedules.make(train)  # config.train.schedule
  # max_grad_norm 0 means no clipping, as in HF Trainer and torch scripts.
  clip = (optax.clip_by_global_norm(train.max_grad_norm) if train.max_grad_norm > 0
          else optax.identity())
  adam = (scale_by_stable_adam if train.optimizer == "stable_adamw" else optax.scale_by_adam)
  parts = [
      clip,
      adam(b1=train.b1, b2=train.b2, eps=train.eps),
      # Decoupled: the decay is added after Adam's scaling, so it is not
      # rescaled by the second-moment estimate (AdamW, and the reference).
      optax.add_decayed_weights(train.weight_decay, mask=decay_mask),
  ]
  if train.optimizer == "lamb":  # AdamW's chain stays as it was: its checkpoints still load
    parts.append(optax.scale_by_trust_ratio())  # after the decay, as optax.lamb
  parts.append(optax.scale_by_learning_rate(schedule))
  if train.ema_spans:  # config.train.phase_ema: last, so it sees the final updates
    parts.append(param_ema(train.ema_spans))
  tx = skip_nonfinite(optax.chain(*parts))
  return tx, schedule
