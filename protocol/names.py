"""Names that fit the protocol: over-long ones shortened the same way everywhere.

Parameter and module paths are data the user does not control well (a deep
``nn.Sequential`` easily passes ``MAX_NAME_CHARS``). Rather than refuse such a name,
the trainer and the server both shorten it with :func:`short_name`: its head and
tail kept, the middle replaced by a hash of the whole, so two long names stay
apart and the same name always shortens to the same text. The trainer's ``hello``
lists the full names of what it shortened under ``model.full_names``
(docs/PROTOCOL.md), for display.

Example:
    >>> short_name("encoder.layer")
    'encoder.layer'
    >>> long = "blocks." * 60 + "weight"
    >>> s = short_name(long)
    >>> len(s), s == short_name(long), s.endswith("weight")
    (256, True, True)
"""

from __future__ import annotations

import hashlib
import re

from .messages import MAX_NAME_CHARS

_HASH_CHARS = 16


def short_name(name: str, limit: int = MAX_NAME_CHARS) -> str:
    """``name`` itself when it fits in ``limit`` characters, else head~hash~tail."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    room = limit - _HASH_CHARS - 2
    head = room // 2
    tail = room - head
    return f"{name[:head]}~{digest}~{name[len(name) - tail:]}"


# Characters that change how the text around them is shown instead of showing
# themselves: C0 and C1 controls (ESC, BEL, CR; tab and newline stay), DEL, the line
# and paragraph separators, and the bidirectional controls (U+202E turns the rest of a
# name around). The dashboard uses the same list (client/js/dom.js, visible()).
_INVISIBLE = re.compile(
    "[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)


def visible(text: str) -> str:
    """``text`` as shown to people: each invisible control as a visible code.

    Names are stored as the trainer sent them; only what is shown changes.

    Example:
        >>> visible("run\u202egnp.exe"), visible("bell\x07 esc\x1b[31m"), visible("a\tb")
        ('run[U+202E]gnp.exe', 'bell[U+0007] esc[U+001B][31m', 'a\tb')
    """
    return _INVISIBLE.sub(lambda m: f"[U+{ord(m.group()):04X}]", text)


def identity_problem(value: object, what: str) -> str | None:
    """Why ``value`` cannot identify a run (``run_id``, ``session``), or None.

    An id is part of the database key and of every URL: it is never shortened, so
    what does not fit is refused with a reason instead.
    """
    if not isinstance(value, str):
        return f"{what}: expected text, got {type(value).__name__}"
    if not value:
        return f"{what}: expected at least 1 character, got none"
    if len(value) > MAX_NAME_CHARS:
        return f"{what}: expected at most {MAX_NAME_CHARS} characters, got {len(value)}"
    if "\x00" in value:
        return f"{what}: expected text without NUL (U+0000), got one"
    if what == "run_id" and ("/" in value or value in (".", "..")):
        return f"{what}: expected no '/' and not '.' or '..' (it is part of URLs), got {value!r}"
    return None
