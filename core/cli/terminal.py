"""What the command line prints that came from outside (session names from the API,
chat text read back from a database, paths, error messages): control characters escaped,
so a name like ``"\\x1b]0;pwned\\x07"`` cannot retitle, recolour or rewrite the terminal."""

from __future__ import annotations

import json
import re

# C0 and C1 controls (ESC, BEL, CR, backspace...) and DEL; lone surrogates (from bytes that
# were not UTF-8) cannot be printed at all. Tabs and newlines are kept where text spans lines.
_UNSAFE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_UNSAFE_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
# what json.dumps(ensure_ascii=False) leaves as it is: DEL, the C1 controls, lone surrogates
_UNSAFE_JSON = re.compile(r"[\x7f-\x9f\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object) -> str:
    """``text`` as one line with every control character escaped (``\\x1b``, ``\\n``)."""
    return _UNSAFE_LINE.sub(_escape, str(text))


def safe_text(text: str) -> str:
    """Multi-line text (a reply, a message) with tabs and newlines kept, other controls escaped."""
    return _UNSAFE_TEXT.sub(_escape, text)


def safe_json(value: object, **dumps) -> str:
    """``value`` as JSON to print, its text readable (not ASCII-escaped) but every control
    character a ``\\u`` escape: the same JSON, nothing a terminal acts on."""
    text = json.dumps(value, ensure_ascii=False, **dumps)
    return _UNSAFE_JSON.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
