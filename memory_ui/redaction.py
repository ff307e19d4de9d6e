"""Redaction: secrets and personal data out of a text before anything about it is stored.

`redact(text)` replaces each secret with `[redacted:<kind>]` and says which kinds it found:

- credentials: `private_key` (PEM and OpenSSH private key blocks, cut ones too),
  `url_credentials` (the `user:pass` of `scheme://user:pass@host`; scheme and host stay),
  `bearer_token`, `jwt`, `aws_key` (AKIA/ASIA key ids, `aws_secret_access_key=…`), `gcp_key`
  (AIza API keys, ya29 OAuth tokens), `azure_key` (storage AccountKey/SharedAccessKey, SAS
  `sig=`, Entra ID client secrets), `api_key` (other providers' keys, `*_token=…`), `password`;
- personal data: `email`, `phone`, `card_number` (Luhn-checked), `iban` (checksum-checked),
  `ssn` (US, ###-##-#### with a valid area, or any 9 digits after "SSN"/"social security")
  and `national_id` (UK National Insurance numbers by shape, US ITINs, and numbers after a
  cue: SIN, Aadhaar, passport, national ID, tax ID…).

Ordinary numbers stay: years, prices, ports, versions, IP addresses, dates, and order,
invoice or ticket numbers (by the word before them). No Django, no database: the detector
(memory_ui.detect) calls it on every message, and anything else may.

One precompiled pattern with a group per kind, tried left to right, so a URL's credentials
are taken before the email-looking `pass@host` inside them. A cheap hint test runs first, and
the pattern uses possessive quantifiers and bounded repeats (no catastrophic backtracking).
"""

from __future__ import annotations

import re
from typing import NamedTuple

KINDS = (
    "private_key",
    "url_credentials",
    "bearer_token",
    "jwt",
    "aws_key",
    "gcp_key",
    "azure_key",
    "api_key",
    "password",
    "email",
    "phone",
    "card_number",
    "iban",
    "ssn",
    "national_id",
)
# kinds that let someone in; the rest is personal data
CREDENTIAL_KINDS = frozenset(KINDS[:9])
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
    r"(?:required|stored|set|in|on|the|a|an|not|too|wrong|incorrect|invalid|expired|missing"  # noqa: S105 — a regex
    r"|empty|correct|reset|changed|saved|kept|managed|rotated|hashed|encrypted|being|still|now"
    r"|also|only|never|always|different|same|weak|strong|long|short|case|at|from|for|and|or"
    r"|of|to|with|policy|manager|protected|needed|mandatory|optional|shared|sent|unknown|fine"
    r"|ok|okay|something|what|whatever|your|my|our|their|its|it|this|that|here|there|below"
    r"|above|hidden|blank|none|null|must|should|will|can|has|had|expiring|updated|generated)"
)
_KEY_BLOCK = r"(?:[A-Z0-9]{1,12}[ ]){0,2}PRIVATE[ ]KEY(?:[ ]BLOCK)?-----"
# a key block cut before its END line (a truncated paste): the lines after it that look like
# key, not going on as base64url or a dotted token, and not another secret (a JWT, an AWS key)
_KEY_LINE_BREAK = r"(?:[ \t]*+(?:\r?\n|\\r\\n|\\n)){1,2}+[ \t]*+"
_KEY_BODY = (
    rf"(?:{_KEY_LINE_BREAK}(?:(?!A[KS]IA[0-9A-Z]{{16}}\b|AIza|eyJ)[A-Za-z0-9+/=]{{16,}}+(?![-_]|\.\w)"
    r"|(?:Proc-Type|DEK-Info|Comment):[^\n\\]{0,200}+"
    r"|[A-Za-z0-9+/=]{1,15}+(?=\s*+(?:\Z|-----))))*+"
)
# "SSN: …", "social security number is …"
_SSN_CUE = r"(?:\b(?i:ssn|ss\#)|\b(?i:social[ ]security)(?:[ ](?i:number|no\.?|num|\#))?)"
# "SIN …", "Aadhaar number: …", "passport no. …"; upper-case abbreviations only
_ID_CUE = (
    r"\b(?:SIN|TIN|ITIN|NINO|BSN|(?i:social[ ]insurance|aadhaa?r|passport|national[ ]id(?:entity)?"
    r"|national[ ]insurance|personal[ ]id|tax[ ](?:id|identification)|id[ ]card))"
    r"(?:[ ](?i:number|no\.?|num|card|\#))?"
)
# a key's value has a letter and a digit, or is long ("max_tokens=4096" is no secret)
_LETTER_AND_DIGIT = r"(?=[A-Za-z_\-./+=]{0,500}+[0-9])(?=[0-9_\-./+=]{0,500}+[A-Za-z])"
_STATED = r"(?:[ \t]*+(?:[:\#=]|(?i:is|was)\b)){0,2}+[ \t]*+"
_SECRET = re.compile(
    rf"""
    # every kind starts a word, but a key block and a SAS signature: skip inside words fast
    (?:(?<!\w)|(?=[-?&]))
    (?:
      (?P<private_key>-----BEGIN[ ]{_KEY_BLOCK}
        (?:[\s\S]{{0,65536}}?-----END[ ]{_KEY_BLOCK}|{_KEY_BODY}))
    | (?P<url>\b[A-Za-z][A-Za-z0-9+.-]{{0,30}}+://)
      (?P<url_v>(?!\[redacted:)[^\s/?\#@:"'<>]{{0,256}}+:
        (?![0-9]{{1,5}}+(?:[/?\#\s"'<>]|$))  # host:port/…, not user:password@
        [^\s?\#"'<>]{{1,256}}?)
      # the "@" after which no other one comes before the path ends: p@ss@host
      @(?=[^\s?\#@"'<>]{{0,2048}}+(?:[\s?\#"'<>]|\Z))
    | (?P<bearer>(?i:\bbearer)\s+)(?P<bearer_v>(?!-----BEGIN)[A-Za-z0-9._~+/-]{{16,4096}}+=*)
    | (?P<jwt>\beyJ[A-Za-z0-9_-]{{4,4096}}+\.[A-Za-z0-9_-]{{2,4096}}+\.[A-Za-z0-9_-]{{0,4096}}+)
    | (?P<aws_key>\b(?:AKIA|ASIA)[0-9A-Z]{{16}}\b)
    | (?P<gcp_key>\b(?:AIza[0-9A-Za-z_-]{{35}}|ya29\.[0-9A-Za-z_-]{{20,2048}}+))
    | (?P<azure_key>(?<![\w~.-])[A-Za-z0-9_~.-]{{3}}[0-9]Q~[A-Za-z0-9_~.-]{{31,34}}+)
    | (?P<azure_k>\b(?i:AccountKey|SharedAccessKey)=|[?&]sig=)
      (?P<azure_v>[A-Za-z0-9+/%]{{16,1024}}+={{0,2}})
    | (?P<api_key>\b(?:
          sk-ant-[A-Za-z0-9_-]{{16,400}}+
        | sk-(?:proj-|svcacct-|admin-|live-|test-)?[A-Za-z0-9_-]{{20,400}}+
        | [rsp]k_(?:live|test)_[A-Za-z0-9]{{16,200}}+
        | gh[pousr]_[A-Za-z0-9]{{30,255}}+
        | github_pat_[A-Za-z0-9_]{{22,255}}+
        | xox[abposr]-[A-Za-z0-9-]{{10,255}}+
        | glpat-[A-Za-z0-9_-]{{20,255}}+
        | hf_[A-Za-z0-9]{{30,255}}+
        | npm_[A-Za-z0-9]{{36}}
      ))
    | (?P<kv_k>\b(?i:(?:[a-z0-9]{{1,30}}+[_-]){{0,3}}{_KEY_NAME})["']?
        (?:\s*[:=]|\s(?i:is|was)\s*:?|\s*=>)\s*["']?)
      (?P<kv_v>(?!-----BEGIN)(?:(?=[A-Za-z0-9_\-./+=]{{24}})|{_LETTER_AND_DIGIT})
        [A-Za-z0-9_\-./+=]{{12,4096}}+)
    | (?P<pw_k>\b(?i:pass(?:word|wd|phrase|code)|pwd)
        (?:\s+(?i:for|on|of|to|at)(?:\s+(?i:the|my|our|this))?\s+[\w.:@/-]{{1,60}}+
          (?:\s+(?!(?i:is|was)\b)[\w.:@/-]{{1,60}}+)?){{0,1}}
        (?:\s*[:=]|\s+(?i:is|was)\b:?)\s*)
      (?P<pw_v>"[^"\n]{{1,1024}}+"|'[^'\n]{{1,1024}}+'
        |(?!(?i:{_NOT_A_PASSWORD}|bearer|basic)\b|-----BEGIN)[^\s"'<>\[\]]{{1,4096}}+)
    | (?P<email>(?<![\w.%+-])(?!git@)[A-Za-z0-9][A-Za-z0-9._%+-]{{0,63}}+
        @[A-Za-z0-9](?:[A-Za-z0-9-]{{0,62}}+\.){{1,8}}[A-Za-z]{{2,24}}+(?![\w-]))
    | (?P<ssn_k>{_SSN_CUE}{_STATED})
      (?P<ssn_v>[0-9]{{3}}(?P<ssn_sep>[- ]?)[0-9]{{2}}(?P=ssn_sep)[0-9]{{4}})(?![0-9])
    | (?P<id_k>{_ID_CUE}{_STATED})
      (?P<id_v>[0-9A-Z](?:[ .-]?[0-9A-Z]){{5,17}})(?![0-9A-Za-z])
    | (?P<ssn>(?<![0-9])[0-9]{{3}}-[0-9]{{2}}-[0-9]{{4}}(?![0-9]))
    | (?P<nino>\b[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z](?:[ ]?[0-9]{{2}}){{3}}[ ]?[A-D]\b)
    | (?P<iban>\b[A-Z]{{2}}\d{{2}}(?:[ ]?[A-Z0-9]{{4}}){{2,7}}+(?:[ ]?[A-Z0-9]{{1,3}})?\b)
    | (?P<num>(?<![\w.+/@$€£\#-])(?:\+\d{{1,3}}[ .-]?)?(?:\(\d{{1,5}}\)[ .-]?)?
        \d{{1,19}}+(?:[ ./-]\d{{1,19}}+){{0,7}}+(?![\w@]))
    )
    """,
    re.VERBOSE,
)
# anything the heavy pattern could match needs one of these
_SECRET_HINT = re.compile(r"[\d@]|(?i:pass|pwd|bearer|key|secret|token|eyJ|AKIA|ASIA|AIza|sig=)")
_TRAILING_PUNCT = ".,;:!?)"
# numbers that are not phones, cards or SSNs, by what precedes them
_NUMBER_CONTEXT = re.compile(
    r"(?:\b(?:order|invoice|ticket|tracking|case|ref|reference|sku|po|build|version|job|run"
    r"|batch|issue|transaction|txn|confirmation|isbn|pid|port)\b(?:\s*(?:number|no\.?|num|id))?"
    r"\s*(?:is|was|:|#)?\s*#?\s*)$"
)
_PHONE_CUE = re.compile(r"\b(?:call|phone|tel|mobile|cell|text|sms|whatsapp|reach|fax)\b")
# an SSN inside a longer run of numbers ("5 123-45-6789")
_SSN_IN_RUN = re.compile(r"(?<![0-9])[0-9]{3}-[0-9]{2}-[0-9]{4}(?![0-9])")
# secrets named by the key they are assigned to ("aws_secret_access_key=…")
_CLOUD_KEY_NAME = (
    ("aws_key", re.compile(r"aws|secret[_-]?access[_-]?key", re.IGNORECASE)),
    ("gcp_key", re.compile(r"gcp|google|gcloud", re.IGNORECASE)),
    ("azure_key", re.compile(r"azure|account[_-]?key", re.IGNORECASE)),
)
# kinds a value is by its own shape, whatever the word before it calls it
_SHAPED_GROUPS = {
    "private_key": "private_key",
    "jwt": "jwt",
    "aws_key": "aws_key",
    "gcp_key": "gcp_key",
    "azure_key": "azure_key",
    "api_key": "api_key",
}
_URL_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,30}+://")
# "the AWS key is AKIA… and the secret is …": 40 characters of base64 near a mention of AWS
_AWS_SECRET = re.compile(r"[A-Za-z0-9/+]{40}")
_AWS_NEAR = re.compile(r"\b(?i:aws)\b|\bA[KS]IA[0-9A-Z]{16}\b")
# UK National Insurance prefixes never issued
_NINO_UNUSED = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})
# US ITINs: 9xx-xx-xxxx with these middle groups
_ITIN_GROUPS = frozenset([*range(50, 66), *range(70, 89), *range(90, 93), *range(94, 100)])


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


def _dashed_ssn_kind(raw: str) -> str | None:
    """ssn, national_id (an ITIN) or None for ###-##-####: areas 000 and 666, group 00 and
    serial 0000 were never issued."""
    area, group, serial = int(raw[:3]), int(raw[4:6]), int(raw[7:])
    if area >= 900:
        return "national_id" if group in _ITIN_GROUPS else None
    if area in (0, 666) or group == 0 or serial == 0:
        return None
    return "ssn"


def _shaped(value: str) -> Redacted | None:
    """A value named by the word before it ("password: …", "id_token=…", "Bearer …") that
    starts as a secret of a narrower kind by its own shape, redacted as that: the AWS key, JWT
    or private key it is; a URL keeps its scheme and host."""
    match = _SECRET.match(value)
    if _URL_START.match(value) or (match is not None and match.lastgroup == "kv_v"):
        inner = redact(value)  # a URL, or another assignment: "key: aws_secret_access_key=…"
        return inner if inner.kinds else None
    kind = _SHAPED_GROUPS.get(match.lastgroup or "") if match is not None else None
    if match is None or kind is None:
        return None
    # The value begins with that shape: all of it goes, named by the shape ("Bearer ya29.….0"
    # is Google's token with more of it glued on), but for a sentence's closing full stop.
    tail = "." if match.end() == len(value) - 1 and value.endswith(".") else ""
    return Redacted(f"[redacted:{kind}]{tail}", [kind])


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


def _after_number_context(text: str, start: int) -> bool:
    return bool(_NUMBER_CONTEXT.search(text[max(0, start - 24) : start].lower()))


def redact(text: str) -> Redacted:
    """The text with secrets and personal data replaced by `[redacted:<kind>]`, and the kinds
    found (sorted, unique), each one of KINDS."""
    if not text or not _SECRET_HINT.search(text):
        return Redacted(text, [])
    kinds: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        group = match.lastgroup
        whole = match.group(0)
        if group in ("private_key", "jwt", "aws_key", "gcp_key", "azure_key", "api_key", "email"):
            kinds.add(group)
            return f"[redacted:{group}]"
        if group == "url_v":
            kinds.add("url_credentials")
            return f"{match.group('url')}[redacted:url_credentials]@"
        if group == "bearer_v":
            shaped = _shaped(whole[len(match.group("bearer")) :])
            if shaped is not None:
                kinds.update(shaped.kinds)
                return f"{match.group('bearer')}{shaped.text}"
            kinds.add("bearer_token")
            return f"{match.group('bearer')}[redacted:bearer_token]"
        if group == "azure_v":
            kinds.add("azure_key")
            return f"{match.group('azure_k')}[redacted:azure_key]"
        if group == "kv_v":
            value = match.group("kv_v")
            tail = "." if value.endswith(".") else ""  # the sentence's full stop
            value = value[: len(value) - len(tail)]
            name = match.group("kv_k")
            shaped = _shaped(value)
            if shaped is not None:
                kinds.update(shaped.kinds)
                return f"{name}{shaped.text}{tail}"
            kind = next((k for k, cue in _CLOUD_KEY_NAME if cue.search(name)), "api_key")
            if kind == "api_key" and _AWS_SECRET.fullmatch(value):
                near = match.string[max(0, match.start() - 120) : match.start()]
                kind = "aws_key" if _AWS_NEAR.search(near) else kind
            kinds.add(kind)
            return f"{name}[redacted:{kind}]{tail}"
        if group == "pw_v":
            value = match.group("pw_v")
            tail = ""
            while value and value[-1] in _TRAILING_PUNCT and len(value) > 1:
                tail = value[-1] + tail
                value = value[:-1]
            shaped = _shaped(value)
            if shaped is not None:
                kinds.update(shaped.kinds)
                return f"{match.group('pw_k')}{shaped.text}{tail}"
            kinds.add("password")
            return f"{match.group('pw_k')}[redacted:password]{tail}"
        if group == "ssn_v":
            digits = "".join(c for c in whole[len(match.group("ssn_k")) :] if c.isdigit())
            # whatever it is called, a 9xx number is an ITIN, never an SSN
            itin = digits[0] == "9" and int(digits[3:5]) in _ITIN_GROUPS
            cued_kind = "national_id" if itin else "ssn"
            kinds.add(cued_kind)
            return f"{match.group('ssn_k')}[redacted:{cued_kind}]"
        if group == "id_v":
            if sum(c.isdigit() for c in match.group("id_v")) < 5:
                return whole
            kinds.add("national_id")
            return f"{match.group('id_k')}[redacted:national_id]"
        if group == "ssn":
            ssn_kind = _dashed_ssn_kind(whole)
            if ssn_kind is None or _after_number_context(match.string, match.start()):
                return whole
            kinds.add(ssn_kind)
            return f"[redacted:{ssn_kind}]"
        if group == "nino":
            if whole[:2] in _NINO_UNUSED:
                return whole
            kinds.add("national_id")
            return "[redacted:national_id]"
        if group == "iban":
            if not _iban_valid(whole):
                return whole
            kinds.add("iban")
            return "[redacted:iban]"
        if group == "num":
            start = match.start()
            # an SSN's shape is narrower than a phone's: "0 123-45-6789" holds one
            if "-" in whole and not _after_number_context(match.string, start):
                parts = _SSN_IN_RUN.sub(replace_ssn, whole)
                if parts != whole:
                    return parts
            number_kind = _number_kind(match.string, start, whole)
            if number_kind is None:
                return whole
            kinds.add(number_kind)
            return f"[redacted:{number_kind}]"
        return whole

    def replace_ssn(match: re.Match[str]) -> str:
        kind = _dashed_ssn_kind(match.group(0))
        if kind is None:
            return match.group(0)
        kinds.add(kind)
        return f"[redacted:{kind}]"

    redacted = _SECRET.sub(replace, text)
    return Redacted(redacted, sorted(kinds))
