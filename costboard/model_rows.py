"""Hot reads written once as SQL, their rows made into models as the ORM makes them.

The ORM compiles a query anew each time it runs. For the reads every API request makes (its
key and project: a select_related over thirty columns) that compiling was most of the read:
0.7 of the key lookup's 1.2 ms. `ModelColumns` lists a model's columns for such a query and
turns its share of a row back into an instance: `Model.from_db` after the database's
converters (none on PostgreSQL; on SQLite, text times and numbers made datetimes and
Decimals), as the ORM's own read does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)
Converter = Callable[[Any, Any, Any], Any]


class ModelColumns(Generic[M]):
    """A model's concrete columns under a table alias in a hand-written query."""

    def __init__(self, model: type[M], alias: str) -> None:
        self.model = model
        self.alias = alias
        self.fields = list(model._meta.concrete_fields)
        self.names = [field.attname for field in self.fields]
        self.table = f"{model._meta.db_table} {alias}"
        self._converters: dict[str, list[tuple[Any, list[Converter]]]] = {}

    def __len__(self) -> int:
        return len(self.fields)

    def select(self) -> str:
        """The columns, in the order `instance` reads them."""
        quote = connection.ops.quote_name
        return ", ".join(f"{self.alias}.{quote(str(field.column))}" for field in self.fields)

    def instance(self, values: Sequence[Any]) -> M:
        """The model of these values (a row's share, in `select`'s order), as the ORM reads it."""
        converted = list(values)
        for n, (column, converters) in enumerate(self._converters_now()):
            for convert in converters:
                converted[n] = convert(converted[n], column, connection)
        return self.model.from_db(connection.alias, self.names, converted)

    def _converters_now(self) -> list[tuple[Any, list[Converter]]]:
        """Each column's expression and converters on this kind of database (built once)."""
        found = self._converters.get(connection.vendor)
        if found is None:
            found = []
            for field in self.fields:
                column = field.get_col(self.alias)
                converters = connection.ops.get_db_converters(column)
                converters += field.get_db_converters(connection)
                found.append((column, converters))
            self._converters[connection.vendor] = found
        return found
