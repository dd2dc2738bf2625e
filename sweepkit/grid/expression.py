"""The boolean expressions of ``-k`` and ``-m``, as in pytest.

Grammar::

    expression: expr? EOF
    expr:       and_expr ('or' and_expr)*
    and_expr:   not_expr ('and' not_expr)*
    not_expr:   'not' not_expr | '(' expr ')' | ident
    ident:      (\\w|[:+\\-.\\[\\]/])+

An expression is compiled once and evaluated per cell with a ``matcher(ident) -> bool``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator

import attrs


class TokenType(enum.Enum):
    LPAREN = "left parenthesis"
    RPAREN = "right parenthesis"
    OR = "or"
    AND = "and"
    NOT = "not"
    IDENT = "identifier"
    EOF = "end of input"


@attrs.frozen
class Token:
    type: TokenType
    value: str
    pos: int


class ParseError(Exception):
    """A malformed expression; ``column`` is 1-based."""

    def __init__(self, column: int, message: str):
        self.column = column
        self.message = message
        super().__init__(f"at column {column}: {message}")


_IDENT = re.compile(r"(\w|[:+\-.\[\]/])+")
_KEYWORDS = {"or": TokenType.OR, "and": TokenType.AND, "not": TokenType.NOT}


def tokenize(text: str) -> Iterator[Token]:
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char.isspace():
            pos += 1
        elif char in "()":
            yield Token(TokenType.LPAREN if char == "(" else TokenType.RPAREN, char, pos)
            pos += 1
        else:
            match = _IDENT.match(text, pos)
            if not match:
                raise ParseError(pos + 1, f"unexpected character {char!r}")
            word = match.group()
            yield Token(_KEYWORDS.get(word, TokenType.IDENT), word, pos)
            pos = match.end()
    yield Token(TokenType.EOF, "", pos)


Node = Callable[[Callable[[str], bool]], bool]


class _Parser:
    def __init__(self, text: str):
        self.tokens = list(tokenize(text))
        self.index = 0

    @property
    def current(self) -> Token:
        return self.tokens[self.index]

    def accept(self, kind: TokenType) -> Token | None:
        if self.current.type is kind:
            token = self.current
            self.index += 1
            return token
        return None

    def reject(self, expected: list[TokenType]):
        got = self.current
        shown = got.type.value if got.type is TokenType.EOF else repr(got.value)
        raise ParseError(got.pos + 1, f"expected {' OR '.join(t.value for t in expected)}; got {shown}")

    def expression(self) -> Node:
        if self.accept(TokenType.EOF):
            return lambda matcher: False
        node = self.expr()
        if not self.accept(TokenType.EOF):
            self.reject([TokenType.EOF])
        return node

    def expr(self) -> Node:
        node = self.and_expr()
        while self.accept(TokenType.OR):
            left, right = node, self.and_expr()
            node = lambda m, left=left, right=right: left(m) or right(m)
        return node

    def and_expr(self) -> Node:
        node = self.not_expr()
        while self.accept(TokenType.AND):
            left, right = node, self.not_expr()
            node = lambda m, left=left, right=right: left(m) and right(m)
        return node

    def not_expr(self) -> Node:
        if self.accept(TokenType.NOT):
            inner = self.not_expr()
            return lambda m: not inner(m)
        if self.accept(TokenType.LPAREN):
            inner = self.expr()
            if not self.accept(TokenType.RPAREN):
                self.reject([TokenType.RPAREN])
            return inner
        token = self.accept(TokenType.IDENT)
        if token is None:
            self.reject([TokenType.NOT, TokenType.LPAREN, TokenType.IDENT])
        name = token.value
        return lambda m: m(name)


@attrs.frozen
class Expression:
    """A compiled ``-k`` / ``-m`` expression."""

    text: str
    node: Node = attrs.field(repr=False)

    @classmethod
    def compile(cls, text: str) -> "Expression":
        """Parse ``text``; :class:`ParseError` names the column of the first mistake."""
        return cls(text, _Parser(text).expression())

    def evaluate(self, matcher: Callable[[str], bool]) -> bool:
        return self.node(matcher)
