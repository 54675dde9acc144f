"""What a model call costs, estimated from a price table in US dollars per million tokens.

The built-in table covers well-known hosted models, and applies only when the model is served
by its vendor (no OPENAI_BASE_URL / ANTHROPIC_BASE_URL, or the vendor's own): a local server is
assumed to cost nothing known, so no price is invented for it. ``TALON_PRICES`` sets or overrides
prices for any model name, local ones included::

    TALON_PRICES=gpt-4.1-mini=0.40/1.60/0.10,qwen2.5:7b=0/0

Each entry is ``model=input/output`` or ``model=input/output/cached`` (cached input tokens; the
input price when left out). A name matches the model exactly, or as a prefix followed by ``-``
(``gpt-4.1`` prices ``gpt-4.1-2025-04-14``); the longest match wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from talon.agent.providers.base import Usage
from talon.errors import ConfigError


@dataclass(frozen=True)
class Price:
    input: float  # USD per million input tokens
    output: float  # USD per million output tokens
    cached: float  # USD per million input tokens read from the prompt cache

    def cost(self, usage: Usage) -> float:
        cached = min(usage.cached_tokens, usage.input_tokens)
        return ((usage.input_tokens - cached) * self.input + cached * self.cached
                + usage.output_tokens * self.output) / 1_000_000


# Vendors' list prices (USD per million tokens: input, output, cached input) for common models.
# Estimates only: a deployment with other prices sets TALON_PRICES.
BUILT_IN: dict[str, Price] = {
    "gpt-4.1": Price(2.00, 8.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "gpt-4o": Price(2.50, 10.00, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "o3": Price(2.00, 8.00, 0.50),
    "o3-mini": Price(1.10, 4.40, 0.55),
    "o4-mini": Price(1.10, 4.40, 0.275),
    "claude-opus-4": Price(15.00, 75.00, 1.50),
    "claude-sonnet-4": Price(3.00, 15.00, 0.30),
    "claude-3-7-sonnet": Price(3.00, 15.00, 0.30),
    "claude-3-5-sonnet": Price(3.00, 15.00, 0.30),
    "claude-3-5-haiku": Price(0.80, 4.00, 0.08),
    "claude-haiku-4-5": Price(1.00, 5.00, 0.10),
}

_VENDOR_HOSTS = ("", "https://api.openai.com/v1", "https://api.openai.com", "https://api.anthropic.com")


def parse_prices(value: str, setting: str = "TALON_PRICES") -> dict[str, Price]:
    prices: dict[str, Price] = {}
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        model, sep, numbers = entry.rpartition("=")
        parts = numbers.split("/")
        try:
            if not sep or not model.strip() or len(parts) not in (2, 3):
                raise ValueError
            values = [float(p) for p in parts]
            if any(v < 0 for v in values):
                raise ValueError
        except ValueError:
            raise ConfigError(f"{setting}: {entry!r} is not model=input/output[/cached] (US dollars per "
                              "million tokens, e.g. gpt-4.1-mini=0.40/1.60/0.10)", [setting]) from None
        prices[model.strip()] = Price(values[0], values[1], values[2] if len(values) == 3 else values[0])
    return prices


@dataclass(frozen=True)
class PriceTable:
    prices: dict[str, Price]

    @classmethod
    def from_settings(cls, settings: object) -> "PriceTable":
        base = {"openai": getattr(settings, "openai_base_url", ""),
                "anthropic": getattr(settings, "anthropic_base_url", "")}.get(getattr(settings, "provider_name", ""), "")
        table = dict(BUILT_IN) if base.rstrip("/") in _VENDOR_HOSTS else {}
        table.update(parse_prices(str(getattr(settings, "prices", ""))))
        return cls(table)

    def price(self, model: str) -> Price | None:
        name = model.split(":", 1)[1] if model.startswith(("openai:", "anthropic:")) else model
        best: tuple[int, Price] | None = None
        for known, price in self.prices.items():
            if name == known or name.startswith(known + "-"):
                if best is None or len(known) > best[0]:
                    best = (len(known), price)
        return best[1] if best else None

    def cost(self, model: str, usage: Usage) -> float | None:
        price = self.price(model)
        return price.cost(usage) if price is not None else None
