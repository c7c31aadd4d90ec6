"""What model calls cost, in US dollars, from the price table ``pricing.toml``.

The table is data (a snapshot of the providers' list prices, shipped beside this module); a
researcher can load another with :func:`load_price_table`. A model that is not in the table
has no price: :func:`cost_of` returns ``None`` and only its tokens are counted.

A name is looked up as given, then lower-cased, then without a provider prefix
(``anthropic/``, ``openai/``) and without a date suffix (``-20250929``, ``-2025-04-14``), so a
dated snapshot is priced as its model.
"""

from __future__ import annotations

import re
import tomllib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servegym.errors import UserError
from servegym.providers.types import Usage

__all__ = ["Price", "PriceTable", "cost_of", "default_price_table", "load_price_table", "price_for"]

_DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")
_PROVIDER_PREFIX = re.compile(r"^(anthropic|openai)[/:]")


class Price(BaseModel):
    """A model's prices in dollars per million tokens."""

    model_config = ConfigDict(extra="forbid")

    model: str = ""
    input: float = Field(ge=0.0)
    output: float = Field(ge=0.0)
    cache_read: float | None = Field(default=None, ge=0.0)
    cache_write: float | None = Field(default=None, ge=0.0)
    aliases: list[str] = Field(default_factory=list)

    def cost(self, usage: Usage) -> float:
        """Dollars for ``usage`` (cached prompt tokens at the cache prices)."""
        cache_read = usage.cache_read_tokens
        cache_write = usage.cache_write_tokens
        uncached = max(0, usage.input_tokens - cache_read - cache_write)
        read_price = self.input if self.cache_read is None else self.cache_read
        write_price = self.input if self.cache_write is None else self.cache_write
        total = (
            uncached * self.input
            + cache_read * read_price
            + cache_write * write_price
            + usage.output_tokens * self.output
        )
        return total / 1_000_000.0


class PriceTable:
    """Prices by model name (and alias)."""

    def __init__(self, prices: dict[str, Price], source: str = "") -> None:
        self.source = source
        self._by_name: dict[str, Price] = {}
        for name, price in prices.items():
            for key in (name, *price.aliases):
                self._by_name[key.lower()] = price

    def models(self) -> list[str]:
        return sorted({p.model for p in self._by_name.values()})

    def lookup(self, model: str) -> Price | None:
        name = model.strip().lower()
        for candidate in (name, _PROVIDER_PREFIX.sub("", name)):
            for key in (candidate, _DATE_SUFFIX.sub("", candidate)):
                price = self._by_name.get(key)
                if price is not None:
                    return price
        return None


def _parse(text: str, source: str) -> PriceTable:
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{source}: not valid TOML ({exc})") from exc
    models = data.get("models")
    if not isinstance(models, dict):
        raise UserError(f'{source}: expected [models."NAME"] tables')
    prices: dict[str, Price] = {}
    for name, entry in models.items():
        if not isinstance(entry, dict):
            raise UserError(f"{source}: models.{name} must be a table")
        try:
            prices[name] = Price(model=name, **entry)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise UserError(f"{source}: models.{name}.{where}: {first['msg']}") from exc
    return PriceTable(prices, source)


def load_price_table(path: Path | str | None = None) -> PriceTable:
    """Load a price table from ``path``, or the bundled ``pricing.toml`` when ``None``."""
    if path is None:
        return default_price_table()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{p}: cannot read the price table ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from None
    return _parse(text, str(p))


@lru_cache(maxsize=1)
def default_price_table() -> PriceTable:
    """The price table shipped with ServeGym."""
    ref = resources.files("servegym.providers").joinpath("pricing.toml")
    return _parse(ref.read_text(encoding="utf-8"), "servegym/providers/pricing.toml")


def price_for(model: str, table: PriceTable | None = None) -> Price | None:
    """The price of ``model``, or ``None`` if the table does not list it."""
    return (table or default_price_table()).lookup(model)


def cost_of(usage: Usage, model: str, table: PriceTable | None = None) -> float | None:
    """Dollars ``usage`` cost on ``model``; ``None`` for a model without a price."""
    price = price_for(model, table)
    return None if price is None else price.cost(usage)
