"""Format checks, boxed extraction, unit-aware quantities, reward values and custom rewards."""

from __future__ import annotations

import math

import pytest

from fastrl.rewards import RewardResult, RewardSpecError, get_reward, has_thinking_format, last_boxed_content, list_rewards
from fastrl.rewards.easy_vqa_reward import normalize_short_answer
from fastrl.rewards.math_reward import extract_math_answer
from fastrl.rewards.quantities import evaluate_expression, parse_quantity, quantities_equal


@pytest.mark.parametrize(
    "text,expected",
    [
        ("\\boxed{12}", "12"),
        ("a \\boxed{5} b \\boxed{ 12 } c", "12"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\sqrt{\\frac{a}{b}}} trailing }", "\\sqrt{\\frac{a}{b}}"),
        ("\\boxed{}", ""),
        ("\\boxed{5", None),
        ("no box", None),
        ("\\boxed{1} then \\boxed{2", None),
        # Box commands other than \boxed{} that models emit (on a reader of \boxed{ only, each of
        # these gave None or the earlier \boxed{5}).
        ("\\fbox{12}", "12"),
        ("\\boxed {12}", "12"),
        ("$\\boxed 12$", "12"),
        ("\\framebox[2cm][c]{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\bbox[border:1px]{7}", "7"),
        ("\\colorbox{yellow}{7}", "7"),
        ("\\boxed{5} then \\fbox{ 12 }", "12"),
        ("\\fbox{12} then \\boxed 5.", "5."),
        ("\\fbox{12} then \\boxed{5", None),
        ("\\boxedx{12}", None),
        # a brace-less box around a command reads its brace groups (a token reader gave "\\frac")
        ("$\\boxed \\frac{1}{2}$", "\\frac{1}{2}"),
        ("\\boxed \\sqrt{\\frac{a}{b}} then", "\\sqrt{\\frac{a}{b}}"),
        ("\\boxed \\pi", "\\pi"),
        ("\\boxed \\frac{1}{2", None),
        # ... and keeps what follows a number (a reader stopping at the backslash gave "2": a
        # false match of the answer 2)
        ("\\boxed 2\\pi", "2\\pi"),
        ("$\\boxed -\\frac{1}{2}$", "-\\frac{1}{2}"),
        ("\\boxed 5\\%", "5\\%"),
        ("\\boxed \\frac12", "\\frac12"),
        ("\\boxed \\frac {1}{2} then", "\\frac {1}{2}"),
    ],
)
def test_last_boxed_content(text, expected):
    assert last_boxed_content(text) == expected


@pytest.mark.parametrize(
    "response,expected",
    [
        ("<thinking>x</thinking> \\boxed{1}", True),
        ("<thinking>\nline\n</thinking>\n\\boxed{1}\n", True),
        ("< thinking >x</ thinking > \\boxed{1}", True),
        ("<think>x</think> \\boxed{1}", False),
        ("<thinking>x</thinking> 1", False),
        ("\\boxed{1} <thinking>x</thinking>", False),
        ("preamble <thinking>x</thinking> \\boxed{1}", False),
    ],
)
def test_thinking_format(response, expected):
    assert has_thinking_format(response) is expected


def test_spec_section7_reward_vectors():
    for name in ("geo3k", "geoqa8k", "math"):
        reward = get_reward(name)
        assert reward("<thinking>x</thinking> The answer is \\boxed{12}", "12").overall == 1.5
        assert reward("<think>x</think> \\boxed{12}", "12").overall == 1.0
        assert reward("<thinking>x</thinking> answer 12", "12").overall == 0.0
        assert reward("<thinking>x</thinking> \\boxed{5} no, \\boxed{12}", "12").accuracy == 1.0
        assert reward("<thinking>x</thinking> \\boxed{5} no, \\boxed{12}", "5").accuracy == 0.0


def test_easy_vqa_strict_needs_format_and_answer():
    strict = get_reward("easy_vqa_strict")
    assert strict("<thinking>x</thinking> \\boxed{red}", "red") == RewardResult(overall=1.0, format=0.5, accuracy=1.0)
    assert strict("\\boxed{red}", "red") == RewardResult(overall=0.0, format=0.0, accuracy=1.0)
    assert strict("<thinking>x</thinking> \\boxed{blue}", "red") == RewardResult(overall=0.0, format=0.5, accuracy=0.0)


def test_normalize_short_answer():
    assert normalize_short_answer("\\text{ The Circle. }") == "circle"
    assert normalize_short_answer("  'Yes'! ") == "yes"
    assert normalize_short_answer("dark   blue") == "dark blue"


def test_extract_math_answer_rules():
    assert extract_math_answer("x \\boxed{3} Answer: 4") == "3"  # the box wins
    assert extract_math_answer("work\nAnswer: $13$.\n") == "13"
    assert extract_math_answer("Answer: 1\nFinal answer: 2") == "2"  # the last line
    assert extract_math_answer("The answer is 13.") is None


@pytest.mark.parametrize(
    "text,number,unit",
    [
        ("60^\\circ", 60.0, "deg"),
        ("60°", 60.0, "deg"),
        ("6\\text{ cm}", 6.0, "cm"),
        ("4\\sqrt{3}\\text{ cm}^{2}", 4 * math.sqrt(3), "cm^2"),
        ("5 square cm", 5.0, "cm^2"),
        ("2 cubic m", 2.0, "m^3"),
        ("2√{3}", 2 * math.sqrt(3), None),
        ("\\sqrt[3]{8}", 2.0, None),
        ("\\frac12", 0.5, None),
        ("AB = 2\\sqrt{2}", 2 * math.sqrt(2), None),
        ("2(1+\\sqrt{2})", 2 * (1 + math.sqrt(2)), None),
        ("\\pi \\div 8 + 1 \\div 2", math.pi / 8 + 0.5, None),
        ("9 square units", 9.0, None),
    ],
)
def test_parse_quantity(text, number, unit):
    quantity = parse_quantity(text)
    assert quantity is not None
    assert quantity.number == pytest.approx(number, rel=1e-12)
    assert quantity.unit == unit


@pytest.mark.parametrize(
    "text", ["a+b", "7 3/4", "1,000", "50%", "(-8)^(1/3)", "\\sqrt{-1}", "1/0", "10^{1000}", "x", "", "__import__('os')"]
)
def test_parse_quantity_refuses(text):
    assert parse_quantity(text) is None


def test_quantities_equal_units():
    q = parse_quantity
    assert quantities_equal(q("6 cm"), q("60 mm"))
    assert quantities_equal(q("0.5 km"), q("500 m"))
    assert quantities_equal(q("24 cm^2"), q("0.0024 m^2"))
    assert quantities_equal(q("\\frac{\\pi}{3} rad"), q("60°"))
    assert quantities_equal(q("60"), q("60°"))  # a bare number is read in the other side's unit
    assert not quantities_equal(q("6 mm"), q("6 cm"))
    assert not quantities_equal(q("24 cm"), q("24 cm^2"))
    assert not quantities_equal(q("60 cm"), q("60°"))
    assert not quantities_equal(q("3.46"), q("2\\sqrt{3}"))


def test_evaluate_expression_is_not_eval():
    assert evaluate_expression("2**3") == 8.0
    assert evaluate_expression("().__class__") is None
    assert evaluate_expression("sqrt(4)(2)") == 4.0


def test_list_and_unknown_rewards():
    assert list_rewards() == ["easy_vqa", "easy_vqa_strict", "geo3k", "geoqa8k", "math"]
    with pytest.raises(RewardSpecError, match="unknown reward 'geo3kk'"):
        get_reward("geo3kk")


def test_custom_reward_from_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "from fastrl.rewards import RewardResult\n"
        "def as_number(response, ground_truth):\n    return 1.0 if ground_truth in response else 0.0\n"
        "def as_mapping(response, ground_truth):\n    return {'overall': 2.0, 'format': 0.5, 'accuracy': 1.0}\n"
        "def as_result(response, ground_truth):\n    return RewardResult(overall=0.25, format=0.25, accuracy=0.0)\n"
        "def bad_type(response, ground_truth):\n    return 'yes'\n"
        "NOT_CALLABLE = 3\n"
    )
    assert get_reward(f"{path}:as_number")("the answer 7", "7") == RewardResult(overall=1.0, format=0.0, accuracy=1.0)
    assert get_reward(f"{path}:as_mapping")("", "") == RewardResult(overall=2.0, format=0.5, accuracy=1.0)
    assert get_reward(f"{path}:as_result")("", "").overall == 0.25
    with pytest.raises(TypeError, match="bad_type returned str"):
        get_reward(f"{path}:bad_type")("", "")
    with pytest.raises(RewardSpecError, match="has no function 'missing'"):
        get_reward(f"{path}:missing")
    with pytest.raises(RewardSpecError, match="not callable"):
        get_reward(f"{path}:NOT_CALLABLE")
    with pytest.raises(RewardSpecError, match="does not exist"):
        get_reward(f"{tmp_path / 'nope.py'}:fn")


def test_invalid_result_is_nan():
    result = RewardResult.invalid("timeout after 1s", timed_out=True)
    assert not result.valid and result.timed_out
    assert all(math.isnan(v) for v in (result.overall, result.format, result.accuracy))
