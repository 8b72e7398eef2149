"""Ollama's ``template`` field of ``/api/generate``: a Go text/template over the request's
system prompt and prompt, rendered here for the subset such templates use.

Taken: ``{{ .System }}``, ``{{ .Prompt }}``, ``{{ .Response }}`` (where the model's reply
begins: the prompt ends there, as Ollama cuts a template at it), ``{{ if .X }}`` ...
``{{ else }}`` ... ``{{ end }}`` on those, comments (``{{/* ... */}}``) and the trim markers
(``{{-`` and ``-}}`` eat the white space beside them). Anything else (``range .Messages``,
``.Tools``, functions) is a :class:`TemplateError` naming the action: a 400, never a prompt
rendered wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ACTION = re.compile(r"\{\{(-?)(.*?)(-?)\}\}", re.DOTALL)
FIELDS = ("System", "Prompt", "Response")
FIELD = re.compile(r"^\.(" + "|".join(FIELDS) + r")$")
CONDITION = re.compile(r"^if\s+\.(" + "|".join(FIELDS) + r")$")
TAKES = (
    "{{ .System }}, {{ .Prompt }}, {{ .Response }} and {{ if }} / {{ else }} / {{ end }} on them"
)


class TemplateError(ValueError):
    """A template this renderer does not take (one line, for a 400)."""


@dataclass
class _Branch:
    """``if .field``: its ``then`` and ``otherwise`` parts (text, a field or a branch each)."""

    field: str
    then: list = field(default_factory=list)
    otherwise: list = field(default_factory=list)


def render(template: str, system: str = "", prompt: str = "") -> str:
    """``template`` with the request's values, cut where ``{{ .Response }}`` stands."""
    parts = _parse(template)
    out: list[str] = []
    _emit(parts, {"System": system, "Prompt": prompt}, out)
    return "".join(out)


def _emit(parts: list, values: dict[str, str], out: list[str]) -> bool:
    """Append the rendered ``parts``; False once the response's place was reached."""
    for part in parts:
        if isinstance(part, _Branch):
            chosen = part.then if values.get(part.field) else part.otherwise
            if not _emit(chosen, values, out):
                return False
        elif isinstance(part, tuple):  # a field
            if part[0] == "Response":
                return False
            out.append(values[part[0]])
        else:
            out.append(part)
    return True


def _parse(template: str) -> list:
    root: list = []
    stack: list[tuple[_Branch, list]] = []  # open branches, and where their parts go now
    current = root
    position = 0
    trim_next = False
    for match in ACTION.finditer(template):
        text = template[position : match.start()]
        if trim_next:
            text = text.lstrip()
        if match.group(1):
            text = text.rstrip()
        if text:
            current.append(text)
        trim_next = bool(match.group(3))
        position = match.end()
        action = match.group(2).strip()
        if action.startswith("/*") and action.endswith("*/"):
            continue
        if FIELD.match(action):
            current.append((FIELD.match(action).group(1),))
        elif CONDITION.match(action):
            branch = _Branch(CONDITION.match(action).group(1))
            current.append(branch)
            stack.append((branch, current))
            current = branch.then
        elif action == "else" and stack and current is stack[-1][0].then:
            current = stack[-1][0].otherwise
        elif action == "end" and stack:
            current = stack.pop()[1]
        else:
            raise TemplateError(
                f"the template's {{{{ {action[:40]} }}}} is not something RadixChat renders: "
                f"it takes {TAKES}"
            )
    if stack:
        raise TemplateError("the template has an {{ if }} without its {{ end }}")
    rest = template[position:]
    if trim_next:
        rest = rest.lstrip()
    if rest:
        current.append(rest)
    return root
