"""A C/C++/CUDA lexer for the kernels/ checks: tokens without comments and string contents, #include lines."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Token:
    kind: str  # "id", "num", "str", "punct"
    text: str
    line: int


@dataclass(frozen=True)
class Include:
    name: str
    angled: bool
    line: int

    @property
    def spelled(self) -> str:
        """The header as the directive names it: `<name>` or `"name"`."""
        return f"<{self.name}>" if self.angled else f'"{self.name}"'


_PUNCT2 = ("::", "->")
_ID_START = re.compile(r"[A-Za-z_$]")
_ID = re.compile(r"[A-Za-z0-9_$]*")
_NUMBER = re.compile(r"(?:\d|\.\d)(?:[eEpP][+-]|[A-Za-z0-9_.'])*")
_STRING_PREFIX = re.compile(r"(?:u8|u|U|L)?R?\"|(?:u8|u|U|L)?'")
_INCLUDE = re.compile(r"\s*(<[^>\n]*>|\"[^\"\n]*\")")
_DIRECTIVE_INCLUDE = re.compile(r"#\s*(include_next|include|import)\b")


def _directive(text: str, i: int, line: int, includes: list[Include]) -> int:
    """At a `#` that starts a line: record an #include (a computed one with an empty name); where lexing goes on."""
    match = _DIRECTIVE_INCLUDE.match(text, i)
    if not match:
        return i + 1
    target = _INCLUDE.match(text, match.end())
    if not target:
        includes.append(Include("", False, line))
        return match.end()
    name = target.group(1)
    includes.append(Include(name[1:-1].strip(), name[0] == "<", line))
    return target.end()


def _literal_end(text: str, prefix: re.Match) -> int:
    """The end of the string or character literal whose opener `prefix` matched."""
    n, opener = len(text), prefix.group(0)
    if opener.endswith('R"'):
        paren = text.find("(", prefix.end())
        delim = text[prefix.end():paren]
        end = text.find(")" + delim + '"', paren)
        return n if end < 0 else end + len(delim) + 2
    quote, end = opener[-1], prefix.end()
    while end < n and text[end] != quote and text[end] != "\n":
        end += 2 if text[end] == "\\" else 1
    return min(end + 1, n)


def lex_cpp(text: str) -> tuple[list[Token], list[Include]]:
    """Tokens of C/C++/CUDA source without comments and string contents, and its #include lines.
    Preprocessor lines are tokenized like code (a macro body can hide an operator call)."""
    tokens: list[Token] = []
    includes: list[Include] = []
    i, line, n = 0, 1, len(text)
    line_start = True  # only whitespace since the last newline
    while i < n:
        c = text[i]
        if c == "\n":
            line, line_start, i = line + 1, True, i + 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if c == "\\" and text.startswith("\n", i + 1):  # line splice
            line, i = line + 1, i + 2
            continue
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
            continue
        if c == "#" and line_start:
            line_start = False
            i = _directive(text, i, line, includes)
            continue
        line_start = False
        prefix = _STRING_PREFIX.match(text, i)
        if prefix and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = _literal_end(text, prefix)
            tokens.append(Token("str", "", line))
            line += text.count("\n", i, end)
            i = end
            continue
        if _ID_START.match(c):
            end = _ID.match(text, i + 1).end()
            tokens.append(Token("id", text[i:end], line))
            i = end
            continue
        number = _NUMBER.match(text, i)
        if number:
            tokens.append(Token("num", number.group(0), line))
            i = number.end()
            continue
        two = text[i:i + 2]
        if two in _PUNCT2:
            tokens.append(Token("punct", two, line))
            i += 2
            continue
        tokens.append(Token("punct", c, line))
        i += 1
    return tokens, includes


def qualified_name(toks: list[Token], k: int) -> tuple[str, int]:
    """The qualified name starting at toks[k] (`at::cuda::getCurrentCUDAStream`) and the index after it."""
    parts = [toks[k].text]
    end = k + 1
    while end + 1 < len(toks) and toks[end].text == "::" and toks[end + 1].kind == "id":
        parts.append(toks[end + 1].text)
        end += 2
    return "::".join(parts), end


def is_call(toks: list[Token], k: int) -> bool:
    """toks[k] opens a call: `(`, or a template argument list `<...>` followed by `(`."""
    if k >= len(toks):
        return False
    if toks[k].text == "(":
        return True
    if toks[k].text != "<":
        return False
    depth = 0
    for j in range(k, min(k + 40, len(toks))):
        if toks[j].text == "<":
            depth += 1
        elif toks[j].text == ">":
            depth -= 1
            if depth == 0:
                return j + 1 < len(toks) and toks[j + 1].text == "("
        elif toks[j].text in (";", "{", "}"):
            return False
    return False
