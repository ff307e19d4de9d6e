"""The pages' query parameters, checked: a value a page cannot use is named, never ignored.

A page that quietly dropped `?state=bogus` showed every session under a URL that said
otherwise. Each reader here returns the value to filter with and records what is wrong
with a bad one in `Checks.errors` (parameter → message naming what it accepts); the page
then answers 422 with those errors shown in its filter form, the bad parameter left out
(the page as without it), as a wrong date already was (docs/pages.md, "Parameters").
A `page` past the last one is refused the same way (the first page shown): a URL names
one page, and a list that has no such page says so rather than showing another.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from django.core.paginator import Page, Paginator
from django.http import QueryDict

from costboard.ingest.schemas import MAX_TAG_VALUE

# `?tag=key=value`, as `tags` allows them (costboard/ingest/schemas.py)
TAG = re.compile(rf"[a-z0-9_.-]{{1,64}}=.{{0,{MAX_TAG_VALUE}}}")  # "key=": the value sent empty
_T = TypeVar("_T")  # a page's rows, whatever the paginator pages
MAX_PAGE_DIGITS = 9  # past any list's last page; int() of thousands of digits is refused


def _listed(values: Iterable[str], *, limit: int = 12) -> str:
    shown = [v for v in values if v]
    text = ", ".join(shown[:limit])
    if len(shown) > limit:
        text += f" (and {len(shown) - limit} more)"
    return text


@dataclass
class Checks:
    """A page's query parameters, read one by one; `errors` holds the bad ones."""

    params: QueryDict
    errors: dict[str, str] = field(default_factory=dict)

    def get(self, name: str, default: str = "") -> str:
        return str(self.params.get(name, default))

    def choice(
        self,
        name: str,
        accepted: Collection[str],
        *,
        what: str,
        blank: str,
        shown: Iterable[str] | None = None,
    ) -> str:
        """One of `accepted`, or "" (absent or empty: `blank`, e.g. "any state"). The message
        lists `shown` (default: `accepted`)."""
        value = self.get(name).strip()
        if not value or value in accepted:
            return value
        listed = list(accepted if shown is None else shown)
        self.errors[name] = (
            f"“{value}” is not {what}: one of {_listed(listed)}, or leave it out for {blank}"
            if listed
            else f"“{value}” is not {what}: there are none here yet; leave it out for {blank}"
        )
        return ""

    def sort(self, name: str, keys: Collection[str], *, default: str) -> str:
        """A column key, "-" before it for descending; `default` when absent."""
        value = self.get(name).strip()
        if not value:
            return default
        if value.removeprefix("-") in keys:
            return value
        self.errors[name] = (
            f"“{value}” is not a column to sort by: one of {_listed(keys)}, "
            "with - before it for descending (e.g. -cost)"
        )
        return default

    def switch(self, name: str, *, meaning: str) -> bool:
        """A checkbox: "1" on; "0" or absent off."""
        value = self.get(name).strip()
        if value in ("", "0", "1"):
            return value == "1"
        self.errors[name] = f"“{value}” is not on or off: 1 to {meaning}, 0 or leave it out not to"
        return False

    def tag(self, name: str = "tag") -> str:
        """`key=value`, a tag as steps and sessions carry it; "" when absent. The key and the
        value are each trimmed, as ingest trims what an event sends: `env= prod` is `env=prod`."""
        key, equals, tag_value = self.get(name).partition("=")
        value = f"{key.strip()}{equals}{tag_value.strip()}"
        if not value or TAG.fullmatch(value):
            return value
        self.errors[name] = (
            f"“{value}” is not a tag: write it as key=value (e.g. feature=search), the key "
            f"up to 64 of a-z 0-9 _ . -, the value up to {MAX_TAG_VALUE} characters"
        )
        return ""

    def pattern(self, name: str, pattern: re.Pattern[str], *, what: str) -> str:
        """A value of `pattern`'s shape (described by `what`), or ""."""
        value = self.get(name).strip()
        if not value or pattern.fullmatch(value):
            return value
        self.errors[name] = f"“{value}” is not {what}"
        return ""

    def page(self, paginator: Paginator[_T], name: str = "page") -> Page[_T]:
        """The page asked for: a number from 1 to the last page. Anything else is named and
        the first page shown."""
        value = self.get(name).strip()
        if not value:
            return paginator.page(1)
        last = paginator.num_pages
        number = int(value) if value.isascii() and value.isdigit() else 0
        if len(value) <= MAX_PAGE_DIGITS and 1 <= number <= last:
            return paginator.page(number)
        pages = "page 1 only" if last == 1 else f"pages 1–{last:,}"
        self.errors[name] = f"“{value[:20]}” is not a page of this list: it has {pages}"
        return paginator.page(1)

    def named(self, errors: dict[str, str]) -> None:
        """Errors found elsewhere (the dates') among these."""
        self.errors.update(errors)

    @property
    def status(self) -> int:
        return 422 if self.errors else 200
