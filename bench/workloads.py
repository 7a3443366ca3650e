"""The workload file (bench/workloads.json) from Python: loading, selection by name, and the sizes
bench/attention_bench.cc derives from a workload (KV bytes a step must read, FLOPs of its causal
attention), so bench/peers.py and bench/report.py measure rates exactly as the C++ bench does.

Kept free of torch and of the binding: bench/report.py and its CPU test import it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

DEFAULT_FILE = Path(__file__).resolve().parent / "workloads.json"
KINDS = ("decode", "prefill", "mixed")
_FIELDS = {"name", "kind", "default", "helper", "num_q_heads", "num_kv_heads", "head_size", "dtype", "kv_dtype",
           "page_size", "window", "shared_prefix", "requests", "parts", "note"}
_ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1}


class WorkloadError(ValueError):
    """A bad workload file or an unknown workload name (the message names the value and what is allowed)."""


@dataclass
class Workload:
    name: str
    kind: str
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    dtype: str
    kv_dtype: str
    page_size: int
    window: Optional[int]
    shared_prefix: int
    groups: list  # [{"count", "query_len", "num_computed_tokens"}] as in the file
    default: bool = False
    helper: bool = False
    parts: list = field(default_factory=list)
    note: str = ""

    @property
    def requests(self) -> list:
        """(query_len, num_computed_tokens) per request, in the scheduler's order."""
        out = []
        for g in self.groups:
            out += [(g["query_len"], g["num_computed_tokens"])] * g["count"]
        return out

    @property
    def uniform(self) -> bool:
        """Every request has the same query length and context (one dense [B, H, L, D] batch)."""
        return len({(q, c) for q, c in self.requests}) == 1

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "default": self.default, "helper": self.helper,
                "num_q_heads": self.num_q_heads, "num_kv_heads": self.num_kv_heads, "head_size": self.head_size,
                "dtype": self.dtype, "kv_dtype": self.kv_dtype, "page_size": self.page_size, "window": self.window,
                "shared_prefix": self.shared_prefix, "requests": self.groups}


def _int(obj, key, minimum, where):
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise WorkloadError(f"{where}: {key!r} must be an integer >= {minimum}, got {v!r}")
    return v


def load(path=DEFAULT_FILE) -> list:
    """The workloads of the file, in file order (the same checks as the C++ bench's loader)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise WorkloadError(f"{path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("workloads"), list):
        raise WorkloadError(f"{path}: expected an object with a 'workloads' array")
    table = []
    for i, e in enumerate(doc["workloads"]):
        where = f"{path}: workloads[{i}]"
        if not isinstance(e, dict):
            raise WorkloadError(f"{where}: expected an object")
        where += f" ({e.get('name')})"
        unknown = sorted(set(e) - _FIELDS)
        if unknown:
            raise WorkloadError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")
        if e.get("kind") not in KINDS:
            raise WorkloadError(f"{where}: kind {e.get('kind')!r} (allowed: {', '.join(KINDS)})")
        groups = e.get("requests")
        if not isinstance(groups, list) or not groups:
            raise WorkloadError(f"{where}: 'requests' must be a non-empty array")
        for g in groups:
            _int(g, "count", 1, where)
            _int(g, "query_len", 1, where)
            _int(g, "num_computed_tokens", 0, where)
        window = e.get("window")
        if window is not None:
            window = _int(e, "window", 1, where)
        w = Workload(name=e["name"], kind=e["kind"], num_q_heads=_int(e, "num_q_heads", 1, where),
                     num_kv_heads=_int(e, "num_kv_heads", 1, where), head_size=_int(e, "head_size", 1, where),
                     dtype=e["dtype"], kv_dtype=e["kv_dtype"], page_size=_int(e, "page_size", 1, where),
                     window=window, shared_prefix=e.get("shared_prefix", 0) or 0,
                     groups=[dict(g) for g in groups], default=bool(e.get("default", False)),
                     helper=bool(e.get("helper", False)), parts=list(e.get("parts", [])), note=e.get("note", ""))
        if w.num_q_heads % w.num_kv_heads:
            raise WorkloadError(f"{where}: num_q_heads must be a multiple of num_kv_heads")
        if w.kv_dtype not in _ELEMENT_BYTES:
            raise WorkloadError(f"{where}: kv_dtype {w.kv_dtype!r} (allowed: {', '.join(_ELEMENT_BYTES)})")
        if w.shared_prefix % w.page_size or any(c < w.shared_prefix for _, c in w.requests):
            raise WorkloadError(f"{where}: shared_prefix must be a multiple of page_size, at most every context")
        if any(x.name == w.name for x in table):
            raise WorkloadError(f"{where}: duplicate name {w.name!r}")
        table.append(w)
    names = {w.name for w in table}
    for w in table:
        for p in w.parts:
            if p not in names:
                raise WorkloadError(f"{path}: workload {w.name}: part {p!r} is not defined in the file")
    return table


def select(table: list, spec: str = "default") -> list:
    """'default' (the file's default entries), 'all' (every non-helper entry) or comma-separated names;
    a mixed workload brings its parts. File order. An unknown name raises WorkloadError naming it and
    the allowed set."""
    by_name = {w.name: w for w in table}
    if spec in ("default", "all"):
        names = [w.name for w in table if not w.helper and (spec == "all" or w.default)]
    else:
        names = [n for n in spec.split(",") if n]
        if not names:
            raise WorkloadError("--workloads: empty list (use default, all or names)")
        for n in names:
            if n not in by_name:
                raise WorkloadError(f"--workloads: unknown workload {n!r} (allowed: default, all, "
                                    f"{', '.join(by_name)})")
    wanted = set(names)
    for n in list(names):
        wanted.update(by_name[n].parts)
    return [w for w in table if w.name in wanted]


@dataclass
class Shape:
    num_reqs: int
    tokens: int
    max_seq: int
    num_blocks: int
    max_pages: int
    kv_bytes: float
    flops: float


def shape_of(w: Workload) -> Shape:
    """As shape_of in bench/attention_bench.cc: KV bytes count every distinct key token some query of
    the step sees once (a window clips each request; a shared prefix counts once); FLOPs are
    4 x head size x q heads x visible (query, key) pairs."""
    prefix_pages = w.shared_prefix // w.page_size
    tokens = max_seq = num_blocks = 0
    max_pages = 1
    pairs = kv_tokens = 0.0
    first_keys = []
    for q, c in w.requests:
        s = q + c
        tokens += q
        max_seq = max(max_seq, s)
        pages = math.ceil(s / w.page_size)
        num_blocks += pages - prefix_pages
        max_pages = max(max_pages, pages)
        first_key = max(0, c + 1 - w.window) if w.window else 0
        first_keys.append(first_key)
        kv_tokens += s - max(first_key, w.shared_prefix)
        if w.window is None:
            pairs += q * c + 0.5 * q * (q + 1.0)
        else:
            pairs += sum(min(w.window, c + i + 1) for i in range(q))
    if w.shared_prefix:
        num_blocks += prefix_pages
        kv_tokens += max(w.shared_prefix - min(f, w.shared_prefix) for f in first_keys)
    kv_bytes = kv_tokens * w.num_kv_heads * w.head_size * 2.0 * _ELEMENT_BYTES[w.kv_dtype]
    flops = 4.0 * w.head_size * w.num_q_heads * pairs
    return Shape(len(w.requests), tokens, max_seq, num_blocks, max_pages, kv_bytes, flops)
