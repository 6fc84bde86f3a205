"""Readiness and capacity: whether this replica can take one more conversation (GET
/v1/ready, what a load balancer or Kubernetes routes by), and how full it is (/metrics,
what an autoscaler scales by). Liveness is GET /v1/health's.

A replica is not ready while it warms up (the engine's graphs, kernels and codec before
Engine.start returns), drains (SIGTERM, Services.drain), after its engine failed, or when
full: --max-connections live connections, or the engine would refuse one more stream (no
KV pages to start it and --max-queued already waiting)."""

from __future__ import annotations

from realtime.metrics import Capacity
from realtime.services import Services


def not_ready_reason(svc: Services) -> str | None:
    """Why the replica cannot take one more conversation now; None when it can."""
    engine = svc.engine
    if not engine.warm:
        return "warming up"
    if svc.draining:
        return "draining"
    if engine.failure is not None:
        return "engine failed"
    if svc.metrics.sessions_active >= svc.config.max_connections:
        return f"full: {svc.config.max_connections} connections are open (--max-connections)"
    if not engine.can_open():
        return f"full: no KV pages for another stream and {engine.config.max_queued} already wait (--max-queued)"
    return None


def capacity(svc: Services, stats: dict, ready: bool) -> Capacity:
    """`stats`: Engine.stats() of this scrape. `used` is the busiest share of a limit: live
    connections of --max-connections, streams decoding of the decode batch, streams waiting
    for KV pages of --max-queued; 1 when the engine would refuse one more stream."""
    max_queued = svc.engine.config.max_queued
    shares = [
        svc.metrics.sessions_active / svc.config.max_connections,
        stats.get("streams_decoding", 0) / max(1, stats.get("decode_max_batch", 1)),
        stats.get("streams_queued", 0) / max_queued if max_queued else 0.0,
    ]
    if svc.engine.warm and svc.engine.failure is None and not svc.engine.can_open():
        shares.append(1.0)
    total = stats.get("kv_pages_total", 0)
    kv_free = stats.get("kv_pages_free", 0) / total if total else 0.0
    return Capacity(ready, min(1.0, max(shares)), kv_free)
