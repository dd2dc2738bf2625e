"""The -k / -m expression language: precedence, parentheses, identifiers, error columns."""

import pytest

from sweepkit.grid.expression import Expression, ParseError


def matches(text: str, names: set[str]) -> bool:
    return Expression.compile(text).evaluate(lambda name: name in names)


@pytest.mark.parametrize(
    ("text", "names", "expected"),
    [
        ("a", {"a"}, True),
        ("a", {"b"}, False),
        ("not a", {"a"}, False),
        ("a and b", {"a"}, False),
        ("a or b", {"b"}, True),
        ("a or b and c", {"a"}, True),          # and binds tighter than or
        ("(a or b) and c", {"a"}, False),
        ("not not a", {"a"}, True),
        ("not (a or b)", set(), True),
        ("tbs512 and not xfail", {"tbs512"}, True),
        ("2xTP2", {"2xTP2"}, True),
        ("lr1e-5 or gmu0.85", {"gmu0.85"}, True),
        ("grids/x.py::base", {"grids/x.py::base"}, True),
        ("", {"a"}, False),
    ],
)
def test_evaluation(text, names, expected):
    assert matches(text, names) is expected


@pytest.mark.parametrize(
    ("text", "column", "message"),
    [
        ("a and", 6, "expected not OR left parenthesis OR identifier; got end of input"),
        ("(a or b", 8, "expected right parenthesis; got end of input"),
        ("a b", 3, "expected end of input; got 'b'"),
        ("a & b", 3, "unexpected character '&'"),
        (")", 1, "expected not OR left parenthesis OR identifier; got ')'"),
        ("not", 4, "got end of input"),
    ],
)
def test_parse_errors_name_the_column(text, column, message):
    with pytest.raises(ParseError) as info:
        Expression.compile(text)
    assert info.value.column == column
    assert message in info.value.message


def test_keywords_are_not_identifiers():
    with pytest.raises(ParseError):
        Expression.compile("and")
