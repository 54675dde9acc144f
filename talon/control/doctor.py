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
    rows.append(("metrics", "GET /metrics on the HTTP server" if settings.metrics else "off (TALON_METRICS=false)"))
    return rows
