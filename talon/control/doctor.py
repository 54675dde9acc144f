"""``talon doctor``'s lines about control: approvals, caps and prices, metrics."""

from __future__ import annotations

from talon.config import Settings
from talon.control.approvals import ApprovalPolicy
from talon.control.caps import caps_from_settings
from talon.control.prices import PriceTable
from talon.errors import ConfigError
from talon.storage.usage import MemoryUsageStore


def control_rows(settings: Settings) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    try:
        policy = ApprovalPolicy.parse(settings.approval, settings.approvers, settings.approval_timeout_s)
        kinds = ", ".join(sorted(policy.kinds)) or "off (no tool call waits)"
        rows.append(("approvals", f"{kinds}; wait {policy.timeout_words}"
                     + (f"; approvers {', '.join(sorted(policy.approvers))}" if policy.approvers else "")))
    except ConfigError as exc:
        rows.append(("approvals", f"INVALID: {exc}"))
    try:
        zone = settings.zone.key
        caps = caps_from_settings(settings, MemoryUsageStore())  # the same validation as `talon run`
        limits = [f"{limit.describe()} {name}" for name, scope in (("per person", caps.person),
                                                                   ("per chat", caps.chat), ("total", caps.total))
                  for limit in scope]
        rows.append(("caps", "; ".join(limits) + f" (days begin at 00:00 {zone})" if limits else "none"))
        price = PriceTable.from_settings(settings).price(settings.model_name)
        rows.append(("model price", f"${price.input:g} in / ${price.output:g} out / ${price.cached:g} cached per "
                                    "million tokens" if price else "unknown (usage is shown in tokens only)"))
    except ConfigError as exc:
        rows.append(("caps", f"INVALID: {exc}"))
    rows.append(("metrics", _metrics_row(settings)))
    return rows


def _metrics_row(settings: Settings) -> str:
    """Where /metrics and /healthz are served, or, when nothing listens (Telegram long polling
    alone), the one setting that serves them."""
    if not settings.metrics:
        return "off (TALON_METRICS=false)"
    from talon.runtime import shared_http_server

    if shared_http_server(settings) is None:
        return (f"not served: with Telegram long polling alone nothing listens. Set TALON_HTTP_PORT={settings.http_port} "
                f"to serve GET /metrics and /healthz on http://{settings.http_host}:{settings.http_port} "
                "(TALON_HTTP_HOST, default 127.0.0.1: this machine only)")
    return f"GET /metrics and /healthz on http://{settings.http_host}:{settings.http_port}"
