"""attnkit: the attention-backend layer of an LLM serving engine, from Python.

A thin package over the C++ library (the extension module ``attnkit._attnkit``):

* :class:`LayerSpec` and :class:`RunnerConfig` describe the layers and the run (dicts with the same
  keys work everywhere a spec or config is taken);
* :class:`ModelRunner` selects a backend per layer, owns the paged KV cache and runs each step:
  ``order_requests`` -> ``prepare_step`` -> ``with runner.forward(): runner.attention(...)``;
* :func:`backends`, :func:`select` and :func:`priority_list` answer selection questions without a
  runner; :func:`replay` replays a batch record as ``attnkit replay`` does;
* :class:`LLM` is the serving engine over a model directory: ``LLM(dir).generate(prompts,
  SamplingParams(max_tokens=...))`` returns the token ids of each request (:class:`Completion`);
* every error of the library is an :class:`Error` (a ``ValueError``) with ``field``, ``value`` and
  ``allowed``; :class:`SelectionError` adds ``candidates``, :class:`InvariantError` ``violations``.

Tensors cross by DLPack without copies: NumPy arrays on the CPU platform, torch or CuPy CUDA tensors
on the CUDA platform (bfloat16 through torch: NumPy has no bfloat16).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional, Sequence

from . import _attnkit
from ._attnkit import (  # noqa: F401  (re-exported)
    ContextParallelGroup,
    Completion,
    ContextParallelHub,
    Error,
    ForwardScope,
    InvariantError,
    LLM,
    ModelRunner,
    SamplingParams,
    Selection,
    SelectionError,
    backends,
    built_with_cuda,
    kv_blocks_for_memory_budget,
    priority_list,
    probe_gpu,
    replay,
    select,
)

__all__ = [
    "ContextParallelGroup",
    "Completion",
    "ContextParallelHub",
    "Error",
    "ForwardScope",
    "InvariantError",
    "LayerSpec",
    "LLM",
    "ModelRunner",
    "RunnerConfig",
    "SamplingParams",
    "Selection",
    "SelectionError",
    "backends",
    "built_with_cuda",
    "cuda_available",
    "kv_blocks_for_memory_budget",
    "priority_list",
    "probe_gpu",
    "replay",
    "select",
]


@dataclass
class LayerSpec:
    """One attention layer: its parameters (what the impl holds, B5) and what it keeps in the KV cache (K1).

    name: unique layer name. num_q_heads, num_kv_heads, head_size: the layer's shape (query head h reads
    KV head h // (num_q_heads // num_kv_heads)). dtype: activations ("float32", "float16", "bfloat16").
    kv_cache_dtype: the cache's dtype (None or "auto": the activation dtype; "fp8_e4m3"/"fp8_e5m2" for fp8).
    block_size: the block manager's block size in tokens. sliding_window: W (a query sees W keys, itself
    included) or None; a windowed layer gets a sliding-window KV spec. soft_cap, scale (None: 1/sqrt(head_size)),
    sinks and alibi_slopes (None or one value per query head): optional features. attn_type: "decoder",
    "encoder", "encoder_only" or "cross". kind: None (full_attention, or sliding_window with a window),
    or "recurrent_state". backend: an explicit backend for this layer (None: the config's, or auto).
    kv_layout ("fused_hnd", "split_nhd", "split_hnd") and kernel_block_size force a layout or kernel page
    size. state_decay: recurrent-state layers only.
    """

    name: str
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    dtype: str = "float16"
    kv_cache_dtype: Optional[str] = None
    block_size: int = 16
    sliding_window: Optional[int] = None
    soft_cap: Optional[float] = None
    scale: Optional[float] = None
    sinks: Optional[Sequence[float]] = None
    alibi_slopes: Optional[Sequence[float]] = None
    attn_type: str = "decoder"
    kind: Optional[str] = None
    backend: Optional[str] = None
    kv_layout: Optional[str] = None
    kernel_block_size: Optional[int] = None
    state_decay: Optional[float] = None


@dataclass
class RunnerConfig:
    """The run: where it computes, which backend, and the sizes every buffer is allocated for once (C3).

    platform: "cpu", "cuda" (this machine's GPU; an error without one) or "auto". backend: a backend name
    for every attention layer, or "auto"/None for automatic selection (S3). max_num_reqs, max_num_tokens,
    max_model_len: the largest step and sequence. num_blocks: manager blocks per attention KV-cache group
    (see kv_blocks_for_memory_budget). num_state_slots: per recurrent-state group (0: max_num_reqs).
    capture_sizes: token counts CUDA graphs are captured for (CUDA only; empty: eager). need_lse: every
    layer must be able to return the LSE. cascade: "heuristic", "never" or "always" (B4).
    optimistic_cpu_lengths: steps may carry host upper bounds (G6). check_invariants: run the V1-V9
    checker after every prepare_step. k_scale, v_scale: fp8 KV scales (K8): a run with an fp8 KV cache
    must set both (1.0 opts in to unit scales; left None it is refused, since e4m3 would clip real K/V
    beyond +-448 silently); other caches take None or 1. kv_poison: what a fresh
    cache holds (None: NaN, or 0 in a KV group whose kernels read whole pages; a non-finite value
    there is refused). compute_capability: for select() with platform "cuda" on a machine without a GPU.
    context_parallel_size, context_parallel_rank, context_parallel_interleave, context_parallel_group:
    D1 decode context parallelism, this runner being one rank (see ContextParallelHub); positions are
    dealt to the ranks in turns of context_parallel_interleave tokens.
    """

    platform: str = "cpu"
    backend: Optional[str] = None
    max_num_reqs: int = 256
    max_num_tokens: int = 8192
    max_model_len: int = 8192
    num_blocks: int = 1024
    num_state_slots: int = 0
    capture_sizes: Sequence[int] = field(default_factory=list)
    need_lse: bool = False
    cascade: str = "heuristic"
    optimistic_cpu_lengths: bool = False
    check_invariants: bool = False
    k_scale: Optional[float] = None
    v_scale: Optional[float] = None
    kv_poison: Optional[float] = None
    compute_capability: Optional[int] = None
    context_parallel_size: int = 1
    context_parallel_rank: int = 0
    context_parallel_interleave: int = 1
    context_parallel_group: Optional[ContextParallelGroup] = None


def cuda_available() -> bool:
    """True when this build has CUDA and the machine a usable GPU (any CUDA error means no GPU)."""
    try:
        return bool(probe_gpu()["available"])
    except Exception:  # noqa: BLE001  (a broken driver is "no GPU", never a crash)
        return False


# --- wrong argument types are attnkit.Error too -----------------------------------------------
# The binding checks its arguments by name where it converts them itself; where the binding's own
# dispatch refuses a call (an argument of a type no overload takes), it raises TypeError before any
# of attnkit's code runs. Every public function and method is wrapped once, here, so that such a
# call raises attnkit.Error as well: field "<name> arguments", value the types given, allowed the
# signatures the binding lists.
def _refuse_argument_types(fn, name):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            text = str(e)
            if "incompatible function arguments" not in text:
                raise
            given = ", ".join([type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()])
            lines = [line.strip() for line in text.splitlines()[1:] if line.strip()[:2].rstrip(".").isdigit()]
            allowed = "; ".join(lines) if lines else "the documented argument types"
            error = Error(f"{name} arguments = ({given}) is invalid (allowed: {allowed})")
            error.field, error.value, error.allowed = f"{name} arguments", f"({given})", allowed
            raise error from None

    return call


def _is_binding_callable(value):
    return type(value).__name__ in ("nb_func", "nb_method")


for _name in ("backends", "built_with_cuda", "kv_blocks_for_memory_budget", "priority_list", "probe_gpu", "replay",
              "select"):
    globals()[_name] = _refuse_argument_types(getattr(_attnkit, _name), _name)
for _cls in (ContextParallelGroup, ContextParallelHub, ForwardScope, LLM, ModelRunner, SamplingParams, Selection):
    for _attr, _value in list(vars(_cls).items()):
        if _attr.startswith("__") and _attr not in ("__init__", "__enter__", "__exit__"):
            continue
        if _is_binding_callable(_value):
            setattr(_cls, _attr, _refuse_argument_types(_value, f"{_cls.__name__}.{_attr}"))
del _name, _cls, _attr, _value

