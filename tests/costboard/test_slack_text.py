"""Text in Slack's mrkdwn (costboard/slack_text.py): escaped as Slack asks, users' names shown
literally, and cut to Block Kit's limits with a visible "…" and never inside an entity or a
character's sequence — here through the alert's message (`slack_message`) and the helpers.
The plain-text cut (`text_cut`, for PagerDuty's summary) keeps the characters' sequences
whole the same way, counting characters.

No field a user can fill makes an alert's headline reach 3,000 characters today (the longest
names escape to about 1,300), so the long ones are payloads as `alert_payload` makes them,
given longer names than the database holds."""

from __future__ import annotations

from typing import Any

import pytest

from costboard.budgets.alert_messages import pagerduty_trigger, slack_message
from costboard.slack_text import slack_cut, slack_escaped, slack_literal, text_cut


def session_payload(session_id: str) -> dict[str, Any]:
    """An exhausted session's alert, as alert_payload makes it."""
    return {
        "delivery_id": 1,
        "event_id": 2,
        "kind": "exhausted",
        "at": "2026-11-10T12:00:00+00:00",
        "project": "acme",
        "session_id": session_id,
        "state": "exhausted",
        "runaway": False,
        "tokens_used": 2_000,
        "token_cap": 1_000,
        "cost_usd": "0.006000",
        "cost_cap_usd": None,
        "detail": {},
        "session_url": "https://costboard.example/sessions/5/?project=acme",
    }


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def headline(session_id: str) -> str:
    return str(slack_message(session_payload(session_id))["blocks"][0]["text"]["text"])


def test_a_headline_past_slacks_limit_is_cut_between_entities_with_an_ellipsis() -> None:
    """Escaped, the id is 3,500 characters of `&amp;`: cut at 3,000 as sent before, the
    headline ended `&am` (Slack shows that as written) and lost its closing `*`."""
    text = headline("a" + "&" * 700)
    # "*" + "acme: session a" + whole entities + "…" + "*", within 3,000
    assert text == "*acme: session a" + "&amp;" * 596 + "…*"
    assert len(text) == 2998


def test_a_headline_of_emoji_is_cut_whole_within_slacks_count() -> None:
    """👍🏽 is two code points and four UTF-16 units (Slack counts the units): cut between
    two of them, never between the hand and its skin tone, and within 3,000 units."""
    text = headline("👍🏽" * 1000)
    assert text == "*acme: session " + "👍🏽" * 745 + "…*"
    assert utf16(text) == 2997


def test_a_field_is_cut_to_2000_keeping_its_label() -> None:
    fields = slack_message(session_payload("<" * 500))["blocks"][1]["fields"]
    assert fields[0]["text"] == "*Session*\n" + "&lt;" * 497 + "…"
    assert len(fields[0]["text"]) <= 2000


@pytest.mark.parametrize(
    ("text", "limit", "cut"),
    [
        ("abcdef", 6, "abcdef"),  # fits: untouched, no ellipsis
        ("abcdefg", 6, "abcde…"),
        ("ab&amp;cd", 6, "ab…"),  # "ab&am…" would show "&am"
        ("ab&amp;cd", 8, "ab&amp;…"),
        ("e\u0301e\u0301e\u0301", 4, "e\u0301…"),  # é as e and its accent: kept together
        ("🇫🇷🇩🇪", 6, "🇫🇷…"),  # two flags of two halves (2 units each)
        ("🇫🇷🇩🇪", 7, "🇫🇷…"),  # room for a half: not taken
        ("👩\u200d👩\u200d👧x", 8, "…"),  # one family of three: whole or not at all
        ("x👩\u200d👩\u200d👧", 8, "x…"),
    ],
)
def test_slack_cut_never_splits_an_entity_or_a_character(text: str, limit: int, cut: str) -> None:
    assert slack_cut(text, limit) == cut
    assert utf16(slack_cut(text, limit)) <= limit


@pytest.mark.parametrize(
    ("text", "limit", "cut"),
    [
        ("abcdef", 6, "abcdef"),  # fits: untouched, no ellipsis
        ("abcdefg", 6, "abcde…"),
        ("ab&amp;cd", 6, "ab&am…"),  # plain text: no entities to keep whole
        ("e\u0301e\u0301e\u0301", 4, "e\u0301…"),  # é as e and its accent: kept together
        ("🇫🇷🇩🇪", 4, "🇫🇷🇩🇪"),  # four characters: fits
        ("🇫🇷🇩🇪", 3, "🇫🇷…"),  # room for a half: not taken
        ("👍🏽👍🏽", 3, "👍🏽…"),  # a hand and its skin tone: two characters
        ("👍🏽👍🏽", 2, "…"),
        ("👩\u200d👩\u200d👧x", 5, "…"),  # one family of three: whole or not at all
        ("x👩\u200d👩\u200d👧", 5, "x…"),
    ],
)
def test_text_cut_never_splits_a_character_and_counts_characters(
    text: str, limit: int, cut: str
) -> None:
    assert text_cut(text, limit) == cut
    assert len(text_cut(text, limit)) <= limit


def test_a_pagerduty_summary_past_1024_characters_is_cut_whole_with_an_ellipsis() -> None:
    """Cut with [:1024] as sent before, the summary ended with a hand parted from its skin
    tone and no sign that it was cut."""
    event = pagerduty_trigger(
        session_payload("x" + "👍🏽" * 600), routing_key="r" * 32, dedup="d", severity="error"
    )
    summary = event["payload"]["summary"]
    assert summary == "acme: session x" + "👍🏽" * 504 + "…"
    assert len(summary) == 1024


def test_slack_escaped_is_slacks_three_entities_only() -> None:
    assert slack_escaped("R&D <!channel> *bold* _it_") == "R&amp;D &lt;!channel&gt; *bold* _it_"


def test_slack_literal_shows_a_name_as_written() -> None:
    assert slack_literal("*a* _b_ ~c~ `d` <e|f> & g") == ("∗a∗ ˍbˍ ∼c∼ ˋdˋ &lt;e|f&gt; &amp; g")
    assert slack_literal("> quoted\n>again") == "\u00ad&gt; quoted\n\u00ad&gt;again"


def test_slack_literal_keeps_a_mark_between_letters_or_digits_as_sent() -> None:
    # Slack formats nothing inside a word: the common ids read, and are copied, as sent
    assert slack_literal("user_123_session") == "user_123_session"
    assert slack_literal("gpt-4o*mini v2~3") == "gpt-4o*mini v2~3"
    assert slack_literal("_lead a_b trail_") == "ˍlead a_b trailˍ"
    assert slack_literal("a_ _b `c`") == "aˍ ˍb ˋcˋ"
