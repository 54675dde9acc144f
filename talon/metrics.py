"""``GET /metrics``: Talon's numbers in the Prometheus text format (the official client).

Each bridge has a registry of its own (no process-wide globals, so tests and embedded uses do not
collide). Labels carry only bounded, non-personal values: channel names, model names, tool names,
kinds and outcomes; never chat ids, people or message text. ``TALON_METRICS=false`` leaves the
route out.

Each registry also has the client's process collector (``process_resident_memory_bytes``, the
process's RSS, and its CPU and open files, read from /proc on Linux) and
``talon_cache_entries{cache=...}``: the size of each bounded per-chat structure (``talon.bounded``),
counted at scrape time, summed over the process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector,
                               generate_latest)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from talon import bounded

if TYPE_CHECKING:
    from talon.runtime import Runtime

METRICS_PATH = "/metrics"
# The registry's tool names: a name the model made up is counted as "unknown", so a model cannot
# grow the label set (or write into it).
UNKNOWN_TOOL = "unknown"


class CacheSizes(Collector):
    """``talon_cache_entries``: every bounded structure's size, as of the scrape."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("talon_cache_entries", "Entries held by each bounded per-chat structure.",
                                   labels=["cache"])
        for name, size in sorted(bounded.sizes().items()):
            family.add_metric([name], size)
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes and the rest, on Linux
        r.register(CacheSizes())
        self.received = Counter("talon_messages_received", "Messages taken into the inbox.", ["channel"], registry=r)
        self.answered = Counter("talon_messages_answered", "Replies delivered.", ["channel"], registry=r)
        self.turns = Counter("talon_turns", "Agent turns, by how they ended.", ["channel", "outcome"], registry=r)
        self.turn_seconds = Histogram("talon_turn_duration_seconds", "Time from a turn's start to its reply.",
                                      ["channel"], registry=r,
                                      buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 900))
        self.model_calls = Counter("talon_model_calls", "Model calls made.", ["model", "purpose"], registry=r)
        self.model_errors = Counter("talon_model_errors", "Model calls that failed, by error kind.",
                                    ["model", "kind"], registry=r)
        self.tokens = Counter("talon_model_tokens", "Tokens as the provider reported them.", ["model", "type"],
                              registry=r)
        self.tool_calls = Counter("talon_tool_calls", "Tool calls, by outcome.", ["tool", "outcome"], registry=r)
        self.deliveries = Counter("talon_deliveries", "Reply deliveries, by outcome.", ["channel", "outcome"],
                                  registry=r)
        self.delivery_retries = Counter("talon_delivery_retries", "Delivery attempts retried after a transient "
                                        "failure.", ["channel"], registry=r)
        self.delivery_statuses = Counter("talon_delivery_statuses", "Delivery receipts the platform reported "
                                         "(WhatsApp status callbacks), by status.", ["channel", "status"], registry=r)
        self.approvals = Counter("talon_approvals", "Approval decisions.", ["kind", "outcome"], registry=r)
        self.cap_refusals = Counter("talon_cap_refusals", "Model calls not made because a cap was reached.",
                                    ["scope"], registry=r)
        self.inbox_depth = Gauge("talon_inbox_depth", "Messages waiting or being answered on this worker.",
                                 registry=r)
        self.inbox_oldest = Gauge("talon_inbox_oldest_age_seconds", "Age of the oldest unanswered message on "
                                  "this worker (0 when none).", registry=r)
        self.leases = Gauge("talon_leases_held", "Chat leases this worker holds (many workers).", registry=r)
        # The names of the tools the agent has now (MCP servers may add some while running).
        self.tool_names: Callable[[], Collection[str]] = frozenset

    def tool(self, name: str, outcome: str) -> None:
        self.tool_calls.labels(name if name in self.tool_names() else UNKNOWN_TOOL, outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def refresh_gauges(runtime: "Runtime") -> None:
    """The gauges, as of now: they are read from the bridge's own state, never a store, so a
    scrape costs no database round trip and cannot hang on one."""
    bridge = runtime.bridge
    metrics = bridge.metrics
    depth, oldest = bridge.backlog()
    metrics.inbox_depth.set(depth)
    metrics.inbox_oldest.set(max(0.0, time.time() - oldest) if oldest is not None else 0.0)
    taken = getattr(bridge, "_taken", None)
    metrics.leases.set(len(taken) if isinstance(taken, dict) else 0)


def add_metrics_route(runtime: "Runtime") -> None:
    http = runtime.http
    if http is None or http.running or getattr(http, "_talon_metrics", False):
        return
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        refresh_gauges(runtime)
        body = runtime.bridge.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    http.add_route("GET", METRICS_PATH, handle)
    setattr(http, "_talon_metrics", True)
