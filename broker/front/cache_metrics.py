"""The response cache's Prometheus metrics, with Triton's names.

Per model (counters, only for models whose config enables the cache, as Triton):
``nv_cache_num_hits_per_model``, ``nv_cache_hit_duration_per_model`` (us),
``nv_cache_num_misses_per_model``, ``nv_cache_miss_duration_per_model`` (us, lookup and
insertion).  For the whole cache (gauges, the names of Triton's local cache):
``nv_cache_num_entries``, ``nv_cache_num_lookups``, ``nv_cache_num_hits``,
``nv_cache_num_misses``, ``nv_cache_num_evictions``, ``nv_cache_util`` (0.0 - 1.0).

Families are plain tuples, so the exposition code renders them like its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferpool.broker.models.registry import Registry
from inferpool.broker.models.response_cache import ResponseCache

Samples = list[tuple[Sequence[str], float]]
MetricRows = tuple[str, str, str, Sequence[str], Samples]  # name, help, kind, labels, samples

_PER_MODEL = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", "count"),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        "cache_hit",
        "us",
    ),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", "count"),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        "cache_miss",
        "us",
    ),
)
_WHOLE = (
    ("nv_cache_num_entries", "Number of responses stored in response cache", "entries"),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", "lookups"),
    ("nv_cache_num_hits", "Number of cache hits in response cache", "hits"),
    ("nv_cache_num_misses", "Number of cache misses in response cache", "misses"),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache", "evictions"),
)


def cache_metrics(registry: Registry, cache: ResponseCache | None) -> list[MetricRows]:
    """The cache's families; none when the server runs without a cache."""
    if cache is None:
        return []
    cached = [mv for mv in registry.all_versions() if cache.enabled_for(mv)]
    out: list[MetricRows] = []
    for name, doc, attr, unit in _PER_MODEL:
        samples: Samples = []
        for mv in cached:
            stat = getattr(mv.stats, attr)
            samples.append(
                ([mv.name, mv.version_str], stat.count if unit == "count" else stat.ns / 1000)
            )
        out.append((name, doc, "counter", ("model", "version"), samples))
    summary = cache.summary()
    for name, doc, key in _WHOLE:
        out.append((name, doc, "gauge", (), [([], float(summary[key]))]))
    out.append(
        ("nv_cache_util", "Cache utilization [0.0 - 1.0]", "gauge", (), [([], cache.utilization())])
    )
    return out
