"""What a handler produced, made storable: tables of hostile text and results."""

from __future__ import annotations

import doctest
import json

import pytest

import supervisor.storable
from supervisor.storable import UnstorableResult, storable_message, storable_result


def test_doctests_pass() -> None:
    result = doctest.testmod(supervisor.storable)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        ("a\x00b\x00", "a\\0b\\0"),
        ("lone \ud800 high", "lone \ufffd high"),
        ("lone \udfff low", "lone \ufffd low"),
        ("pair \ud83d\ude00 kept as one replacement each", None),
        ("é ünïcode stays", "é ünïcode stays"),
        ("", ""),
    ],
)
def test_messages_lose_nul_and_lone_surrogates(text: str, expected: str | None) -> None:
    out = storable_message(text)
    out.encode("utf-8")  # encodable: no driver can refuse it for its characters
    assert "\x00" not in out
    if expected is not None:
        assert out == expected


def test_a_long_message_is_cut_and_says_so() -> None:
    out = storable_message("y" * 20_000_000)
    assert out.startswith("y" * 4000)
    assert out.endswith(" [... 19996000 more characters cut]")
    assert storable_message("z" * 4000) == "z" * 4000  # at the cap: untouched


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1},
        {"text": "a\x00b", "k\x00": ["\x00"]},
        {"text": "lone \ud800"},
        ["é", {"x": None}],
        "just a string",
    ],
)
def test_results_are_ascii_json_that_reads_back_the_same(value: object) -> None:
    raw = json.dumps(value, ensure_ascii=False)  # what a worker that skipped escaping sends
    out = storable_result(raw)
    assert out.isascii() and "\x00" not in out
    assert json.loads(out) == value


def test_a_plain_result_is_passed_through_untouched() -> None:
    text = json.dumps({"pages": 12, "t": "a\x00b"})  # json.dumps escapes NUL already
    assert storable_result(text) is text


@pytest.mark.parametrize("text", ["{not json é", "NaN\x00", "\x00", '["é", 2'])
def test_a_result_that_is_not_json_is_refused(text: str) -> None:
    with pytest.raises(UnstorableResult, match="result is not valid JSON"):
        storable_result(text)
