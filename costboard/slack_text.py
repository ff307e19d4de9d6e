"""Text in Slack's mrkdwn, for every Slack message Costboard sends — an alert's
(costboard/budgets/alert_messages.py) and the showback report's (costboard/reports/messages.py);
docs/budgets.md, "Channels", says what a reader sees.

- `slack_escaped`: `&`, `<` and `>` as the entities Slack's "Escaping text" asks for — in our
  own sentences and in URLs, so no text of ours opens a link or a mention.
- `slack_literal`: a name users control (a project, session or user id, a tag value, a
  budget or model name) shown as written. Escaped as above, so `<!channel>` or
  `<https://evil|click>` is text; and since Slack has no escape for `*`, `_`, `~` and a
  backtick (a zero-width space beside one makes it format, not the reverse), each that could
  open or close a format is sent as a look-alike that formats nothing (∗ ˍ ∼ ˋ). One between
  two letters or digits formats nothing in Slack and stays as written, so `user_123_session`
  reads (and is copied) as sent. A `>` opening a line gets an invisible soft hyphen before
  it, so it quotes nothing.
- `slack_cut`: text cut to a Block Kit limit (3,000 characters for a section's text, 2,000
  for a field) with a visible "…", never inside an entity (`&am`) or a character's
  sequence (an accent and its letter, an emoji and its modifiers, a flag's two halves).
- `text_cut`: plain text (no entities: PagerDuty's summary) cut the same way to a limit in
  characters.
"""

from __future__ import annotations

import re
import unicodedata

ELLIPSIS = "…"
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_ESCAPES = str.maketrans(_ENTITIES)
# Slack's formatting characters, each as a look-alike Slack reads as text
LOOKALIKES = {"*": "\u2217", "_": "\u02cd", "~": "\u223c", "`": "\u02cb"}
_FORMATS = re.compile(r"[*_~]")
_SOFT_HYPHEN = "\u00ad"
_ZWJ = "\u200d"


def slack_escaped(text: str) -> str:
    """`text` with Slack's three control characters escaped (its docs, "Escaping text")."""
    return text.translate(_ESCAPES)


def slack_literal(text: str) -> str:
    """A name users control, shown as written: nothing in it formats, links or mentions."""
    shown = slack_escaped(_FORMATS.sub(_lookalike, text).replace("`", LOOKALIKES["`"]))
    lines = shown.split("\n")
    return "\n".join(_SOFT_HYPHEN + line if line.startswith("&gt;") else line for line in lines)


def _lookalike(match: re.Match[str]) -> str:
    """A formatting character's look-alike, unless it stands between two letters or digits
    (`snake_case`, `a*b`), where Slack reads it as text."""
    text, at = match.string, match.start()
    if 0 < at < len(text) - 1 and text[at - 1].isalnum() and text[at + 1].isalnum():
        return match.group()
    return LOOKALIKES[match.group()]


def _units(char: str) -> int:
    """UTF-16 code units, never fewer than characters: a cut fits whether Slack counts
    characters or, as JavaScript does, units (a character past U+FFFF, an emoji, is two)."""
    return 2 if ord(char) > 0xFFFF else 1


def _joins_previous(char: str) -> bool:
    """Part of the character before it: a combining mark, a variation selector, an emoji
    modifier or tag, a zero-width joiner."""
    code = ord(char)
    return (
        unicodedata.category(char) in {"Mn", "Mc", "Me"}
        or char == _ZWJ
        or 0xFE00 <= code <= 0xFE0F
        or 0x1F3FB <= code <= 0x1F3FF
        or 0xE0020 <= code <= 0xE007F
    )


def _regional(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF  # half a flag


def _boundary(text: str, end: int) -> int:
    """The nearest place at or before `end` that splits no entity and no character's
    sequence."""
    amp = text.rfind("&", 0, end)
    if amp != -1 and ";" not in text[amp:end] and text[amp:].startswith(("&amp;", "&lt;", "&gt;")):
        end = amp
    return _sequence_boundary(text, end)


def _sequence_boundary(text: str, end: int) -> int:
    """The nearest place at or before `end` that splits no character's sequence (a grapheme,
    as far as a reader would draw it as one)."""
    while 0 < end < len(text) and (_joins_previous(text[end]) or text[end - 1] == _ZWJ):
        end -= 1
    if 0 < end < len(text) and _regional(text[end]):
        start = end
        while start > 0 and _regional(text[start - 1]):
            start -= 1
        if (end - start) % 2:  # the cut would part a flag's two halves
            end -= 1
    return end


def slack_cut(text: str, limit: int) -> str:
    """`text` whole if it fits `limit` (in UTF-16 code units), else its longest start that
    ends at a boundary (`_boundary`) followed by "…", together within `limit`."""
    if sum(_units(c) for c in text) <= limit:
        return text
    room, end = limit - len(ELLIPSIS), 0
    for char in text:
        room -= _units(char)
        if room < 0:
            break
        end += 1
    return text[: _boundary(text, end)] + ELLIPSIS


def text_cut(text: str, limit: int) -> str:
    """Plain `text` whole if it fits `limit` (in characters), else its longest start that
    splits no character's sequence (`_sequence_boundary`) followed by "…", within `limit`."""
    if len(text) <= limit:
        return text
    return text[: _sequence_boundary(text, limit - len(ELLIPSIS))] + ELLIPSIS
