"""The edit form of the review queue and the memory browser. Every field is checked by its
rule in memory_ui.cleaners, the one the API's models use, so a page and the API refuse the
same input with the same words; each error names its field. A valid form gives the typed
MemoryFields that decisions.memory_edit writes as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms

from costboard.input_limits import digit_count
from memory_ui import cleaners
from memory_ui.models import MAX_CONTENT, Memory

LABELS = {
    "content": "Content",
    "type": "Type",
    "scope": "Scope",
    "importance": "Importance",
    "tags": "Tags",
    "ttl_days": "TTL days",
}


def _ttl(value: str) -> int | None:
    """The typed days as a number for the TTL's rule; text that is not one (a fraction, '²',
    thousands of digits) goes to the rule as it is, which refuses it in the rule's words."""
    text = value.strip()
    days = digit_count(text, cleaners.MAX_TTL_DAYS)
    return cleaners.clean_ttl_days(days if days is not None else text or None)


def _tags(value: str) -> tuple[str, ...]:
    return cleaners.clean_tags([t for t in (part.strip() for part in value.split(",")) if t])


CLEANERS: dict[str, Callable[[str], Any]] = {
    "content": cleaners.clean_content,
    "type": cleaners.clean_type,
    "scope": lambda value: cleaners.clean_scope(value.strip()),
    "importance": lambda value: cleaners.clean_importance(value.strip()),
    "tags": _tags,
    "ttl_days": _ttl,
}


class MemoryEditForm(forms.Form):
    """Content, type, scope, importance, tags (comma-separated) and TTL days; `memory_fields`
    is what `decisions.memory_edit` takes."""

    content = forms.CharField(required=False, strip=False, widget=forms.Textarea)
    type = forms.CharField(required=False)
    scope = forms.CharField(required=False)
    importance = forms.CharField(required=False)
    tags = forms.CharField(required=False)
    ttl_days = forms.CharField(required=False)

    max_content = MAX_CONTENT
    types = Memory.Type.values
    _fields: cleaners.MemoryFields

    @classmethod
    def for_memory(cls, memory: Memory) -> MemoryEditForm:
        return cls(
            initial={
                "content": memory.content,
                "type": memory.type,
                "scope": memory.scope,
                "importance": f"{memory.importance.normalize():f}",
                "tags": ", ".join(memory.tags),
                "ttl_days": "" if memory.ttl_days is None else str(memory.ttl_days),
            }
        )

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned: dict[str, Any] = {}
        for name, cleaner in CLEANERS.items():
            if name in self.errors:  # Django's own check refused it (a NUL): said once
                continue
            try:
                cleaned[name] = cleaner(self.data.get(name, "") or "")
            except cleaners.MemoryInputError as error:
                self.add_error(name, f"{LABELS[name]}: {error.message}.")
        self.cleaned_data = cleaned
        if not self.errors:
            try:  # redacted as they are made: content may come out too long
                self._fields = cleaners.MemoryFields(**cleaned)
            except cleaners.MemoryInputError as error:
                self.add_error(error.field, f"{LABELS[error.field]}: {error.message}.")
        return cleaned

    def memory_fields(self) -> cleaners.MemoryFields:
        """The checked fields of a valid form, their secrets redacted (`redactions` says
        which kinds, for the reviewer to be told)."""
        return self._fields

    @property
    def focus(self) -> str:
        """The field to put the cursor in: the first refused one, else the content."""
        return next((name for name in CLEANERS if name in self.errors), "content")

    def content_length(self) -> int:
        """What the counter starts at: the length the service will check."""
        value = self["content"].value() or ""
        return len(" ".join(str(value).split()))
