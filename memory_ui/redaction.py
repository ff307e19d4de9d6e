"""Redaction: secrets and personal data out of a text before anything about it is stored.

`redact(text)` replaces API keys, bearer tokens, JWTs, passwords, emails, phone numbers, card
numbers (Luhn-checked) and IBANs (checksum-checked) with `[redacted:<kind>]` and says which
kinds it found. Ordinary numbers stay: years, prices, ports, versions, IP addresses, and
order, invoice or ticket numbers (by the word before them). No Django, no database: the
detector (memory_ui.detect) calls it on every message, and anything else may.

One precompiled pattern with a group per kind; a cheap hint test runs first, and the pattern
uses possessive quantifiers and bounded repeats (no catastrophic backtracking).
"""

from __future__ import annotations

import re
from typing import NamedTuple

KINDS = ("api_key", "bearer_token", "jwt", "password", "email", "phone", "card_number", "iban")
# what redact() leaves in place of a secret; MARKER.findall gives the kinds in a text
MARKER = re.compile(r"\[redacted:(\w+)\]")


class Redacted(NamedTuple):
    """A text as redacted, and the kinds found in it (sorted, unique). A tuple, so
    `text, kinds = redact(...)` works."""

    text: str
    kinds: list[str]


_KEY_NAME = (
    r"(?:api[_-]?key|apikey|access[_-]?key(?:[_-]?id)?|secret(?:[_-]?(?:access[_-]?)?key)?"
    r"|client[_-]?secret|(?:auth|access|refresh|api|bot|session|bearer)?[_-]?token"
    r"|private[_-]?key|signing[_-]?key)"
)
# words that follow "password is" without being one ("the password is stored in Vault")
_NOT_A_PASSWORD = (
    r"(?:required|stored|set|in|on|the|a|an|not|too|wrong|incorrect|invalid|expired|missing"
    r"|empty|correct|reset|changed|saved|kept|managed|rotated|hashed|encrypted|being|still|now"
    r"|also|only|never|always|different|same|weak|strong|long|short|case|at|from|for|and|or"
    r"|of|to|with|policy|manager|protected|needed|mandatory|optional|shared|sent|unknown|fine"
    r"|ok|okay|something|what|whatever|your|my|our|their|its|it|this|that|here|there|below"
    r"|above|hidden|blank|none|null|must|should|will|can|has|had|expiring|updated|generated)"
)
_SECRET = re.compile(
    rf"""
      (?P<bearer>(?i:\bbearer)\s+)(?P<bearer_v>[A-Za-z0-9._~+/-]{{16,4096}}+=*)
    | (?P<jwt>\beyJ[A-Za-z0-9_-]{{4,4096}}+\.[A-Za-z0-9_-]{{4,4096}}+\.[A-Za-z0-9_-]{{0,4096}}+)
    | (?P<api_key>\b(?:
          sk-ant-[A-Za-z0-9_-]{{16,400}}+
        | sk-(?:proj-|svcacct-|admin-|live-|test-)?[A-Za-z0-9_-]{{20,400}}+
        | [rsp]k_(?:live|test)_[A-Za-z0-9]{{16,200}}+
        | (?:AKIA|ASIA)[0-9A-Z]{{16}}\b
        | gh[pousr]_[A-Za-z0-9]{{30,255}}+
        | github_pat_[A-Za-z0-9_]{{22,255}}+
        | xox[abposr]-[A-Za-z0-9-]{{10,255}}+
        | AIza[0-9A-Za-z_-]{{35}}
        | glpat-[A-Za-z0-9_-]{{20,255}}+
        | hf_[A-Za-z0-9]{{30,255}}+
        | npm_[A-Za-z0-9]{{36}}
      ))
    | (?P<kv_k>\b(?i:(?:[a-z0-9]{{1,30}}+[_-]){{0,3}}{_KEY_NAME})["']?
        (?:\s*[:=]|\s(?i:is|was)\s*:?|\s*=>)\s*["']?)
      (?P<kv_v>[A-Za-z0-9_\-./+=]{{12,500}}+)
    | (?P<pw_k>\b(?i:pass(?:word|wd|phrase|code)|pwd)
        (?:\s+(?i:for|on|of|to|at)(?:\s+(?i:the|my|our|this))?\s+[\w.:@/-]{{1,60}}+
          (?:\s+(?!(?i:is|was)\b)[\w.:@/-]{{1,60}}+)?){{0,1}}
        (?:\s*[:=]|\s+(?i:is|was)\b:?)\s*)
      (?P<pw_v>"[^"\n]{{1,128}}+"|'[^'\n]{{1,128}}+'
        |(?!(?i:{_NOT_A_PASSWORD})\b)[^\s"'<>\[\]]{{1,128}}+)
    | (?P<email>(?<![\w.%+-])(?!git@)[A-Za-z0-9][A-Za-z0-9._%+-]{{0,63}}+
        @[A-Za-z0-9](?:[A-Za-z0-9-]{{0,62}}+\.){{1,8}}[A-Za-z]{{2,24}}+(?![\w-]))
    | (?P<iban>\b[A-Z]{{2}}\d{{2}}(?:[ ]?[A-Z0-9]{{4}}){{2,7}}+(?:[ ]?[A-Z0-9]{{1,3}})?\b)
    | (?P<num>(?<![\w.+/@$€£#-])(?:\+\d{{1,3}}[ .-]?)?(?:\(\d{{1,5}}\)[ .-]?)?
        \d{{1,19}}+(?:[ ./-]\d{{1,19}}+){{0,7}}+(?![\w@]))
    """,
    re.VERBOSE,
)
# anything the heavy pattern could match needs one of these
_SECRET_HINT = re.compile(r"[\d@]|(?i:pass|pwd|bearer|key|secret|token|eyJ)")
_TRAILING_PUNCT = ".,;:!?)"
# numbers that are not phones or cards, by what precedes them
_NUMBER_CONTEXT = re.compile(
    r"(?:\b(?:order|invoice|ticket|tracking|case|ref|reference|sku|po|build|version|job|run"
    r"|batch|issue|transaction|txn|confirmation|isbn|pid|port)\b(?:\s*(?:number|no\.?|num|id))?"
    r"\s*(?:is|was|:|#)?\s*#?\s*)$"
)
_PHONE_CUE = re.compile(r"\b(?:call|phone|tel|mobile|cell|text|sms|whatsapp|reach|fax)\b")


def _luhn(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _iban_valid(raw: str) -> bool:
    code = raw.replace(" ", "")
    if not 15 <= len(code) <= 34:
        return False
    moved = code[4:] + code[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _number_kind(text: str, start: int, raw: str) -> str | None:
    """card_number, phone or None for a run of digits with separators."""
    digits = "".join(c for c in raw if c.isdigit())
    count = len(digits)
    if count < 8 or _NUMBER_CONTEXT.search(text[max(0, start - 24) : start].lower()):
        return None
    plain = raw[0] != "+" and "(" not in raw and "." not in raw and "/" not in raw
    if plain and 13 <= count <= 19 and _luhn(digits) and len(set(digits)) > 1:
        return "card_number"
    if raw[0] == "+":
        return "phone" if 8 <= count <= 15 else None
    groups = re.split(r"[ ./()-]+", raw.strip("()"))
    if 9 <= count <= 12 and len(groups) >= 2:
        separators = {c for c in raw if not c.isdigit()}
        if separators == {"."} and len(groups) == 4 and all(len(g) <= 3 for g in groups):
            return None  # an IP address
        shape = [len(g) for g in groups]
        if raw[0] in "(0" or shape == [3, 3, 4]:
            return "phone"
        return None
    if count in (10, 11) and len(groups) == 1:
        before = text[max(0, start - 30) : start].lower()
        return "phone" if _PHONE_CUE.search(before) else None
    return None


def redact(text: str) -> Redacted:
    """The text with secrets and personal data replaced by `[redacted:<kind>]`, and the kinds
    found (sorted, unique): api_key, bearer_token, jwt, password, email, phone, card_number,
    iban."""
    if not text or not _SECRET_HINT.search(text):
        return Redacted(text, [])
    kinds: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        group = match.lastgroup
        whole = match.group(0)
        if group == "bearer_v":
            kinds.add("bearer_token")
            return f"{match.group('bearer')}[redacted:bearer_token]"
        if group == "jwt" or group == "api_key" or group == "email":
            kinds.add(group)
            return f"[redacted:{group}]"
        if group == "kv_v":
            value = match.group("kv_v")
            letters = any(c.isalpha() for c in value)
            if not (letters and any(c.isdigit() for c in value)) and len(value) < 24:
                return whole
            kinds.add("api_key")
            return f"{match.group('kv_k')}[redacted:api_key]"
        if group == "pw_v":
            value = match.group("pw_v")
            tail = ""
            while value and value[-1] in _TRAILING_PUNCT and len(value) > 1:
                tail = value[-1] + tail
                value = value[:-1]
            kinds.add("password")
            return f"{match.group('pw_k')}[redacted:password]{tail}"
        if group == "iban":
            if not _iban_valid(whole):
                return whole
            kinds.add("iban")
            return "[redacted:iban]"
        if group == "num":
            kind = _number_kind(match.string, match.start(), whole)
            if kind is None:
                return whole
            kinds.add(kind)
            return f"[redacted:{kind}]"
        return whole

    redacted = _SECRET.sub(replace, text)
    return Redacted(redacted, sorted(kinds))
