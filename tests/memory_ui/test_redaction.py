"""Redaction (memory_ui.redaction): every secret of the labelled corpus removed and its kind
named, phone and card formats told apart from years, prices, ports and order numbers, ordinary
text left alone, and what is redacted stays redacted."""

from __future__ import annotations

import pytest

from memory_ui.redaction import KINDS, MARKER, Redacted, redact
from tests.memory_ui.corpus import CARDS, CORPUS, NOT_CARDS, NOT_PHONES, PHONES, Sample


@pytest.mark.parametrize("sample", [s for s in CORPUS if s.secrets], ids=lambda s: s.text[:40])
def test_redaction_removes_each_secret_and_names_its_kind(sample: Sample) -> None:
    redacted, kinds = redact(sample.text)
    for secret in sample.secrets:
        assert secret not in redacted
    assert kinds == sorted(set(sample.redactions))
    for kind in kinds:
        assert f"[redacted:{kind}]" in redacted


@pytest.mark.parametrize("phone", PHONES)
def test_phone_formats_are_redacted(phone: str) -> None:
    redacted, kinds = redact(f"call me at {phone} after lunch")
    assert kinds == ["phone"], redacted
    assert redacted == "call me at [redacted:phone] after lunch"


@pytest.mark.parametrize("text", NOT_PHONES)
def test_years_prices_ports_versions_and_order_numbers_are_not_phones(text: str) -> None:
    assert redact(f"it was {text} today") == (f"it was {text} today", [])


@pytest.mark.parametrize("card", CARDS)
def test_card_numbers_passing_luhn_are_redacted(card: str) -> None:
    assert redact(f"my card {card} expires soon") == (
        "my card [redacted:card_number] expires soon",
        ["card_number"],
    )


@pytest.mark.parametrize("text", NOT_CARDS)
def test_luhn_invalid_runs_and_order_numbers_are_not_cards(text: str) -> None:
    assert redact(f"it was {text} today") == (f"it was {text} today", [])


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("key AKIAIOSFODNN7EXAMPLE here", "api_key"),
        ("use sk-ant-api03-Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf9 now", "api_key"),
        ("token ghp_8aB3cD5eF7gH9iJ1kL3mN5oP7qR9sT1uV3wX", "api_key"),
        ("pat github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "api_key"),
        ("slack xoxp-1234567890-abcdefghij", "api_key"),
        ("maps AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW ok", "api_key"),
        ("secret=Zm9vYmFyYmF6cXV4MTIzNDU2", "api_key"),
        ("Authorization: Bearer abcdefghijklmnop1234567890", "bearer_token"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "jwt"),
        ("the passwd: s3cr3t! for root", "password"),
        ("pwd=letmein123", "password"),
        ("IBAN GB82 WEST 1234 5698 7654 32 please", "iban"),
        ("write to a.b-c+tag@sub.example.co.uk.", "email"),
    ],
)
def test_each_kind_of_secret_is_redacted(text: str, kind: str) -> None:
    redacted, kinds = redact(text)
    assert kinds == [kind], redacted
    assert f"[redacted:{kind}]" in redacted


@pytest.mark.parametrize(
    "text",
    [
        "The password is stored in Vault.",
        "max_tokens=4096 and temperature=0.2",
        "The token budget is 10000 per session.",
        "Clone it with git@github.com:acme/api.git",
        "Upgrade to Python 3.12.4 before 2025-03-01.",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) == (text, [])


def test_the_result_names_its_parts_and_unpacks_as_a_pair() -> None:
    result = redact("mail ann@example.com or call +44 20 7946 0958")
    assert isinstance(result, Redacted)
    assert result.text == "mail [redacted:email] or call [redacted:phone]"
    assert result.kinds == ["email", "phone"]
    text, kinds = result
    assert (text, kinds) == (result.text, result.kinds)


def test_every_kind_the_corpus_reports_is_a_known_kind_and_its_marker_parses() -> None:
    seen = set()
    for sample in CORPUS:
        text, kinds = redact(sample.text)
        assert set(kinds) <= set(KINDS), sample.text
        assert sorted(set(MARKER.findall(text))) == kinds, sample.text
        seen.update(kinds)
    assert seen == set(KINDS)


@pytest.mark.parametrize("sample", CORPUS, ids=lambda s: s.text[:40])
def test_a_redacted_text_redacts_to_itself(sample: Sample) -> None:
    once = redact(sample.text).text
    assert redact(once) == (once, [])
