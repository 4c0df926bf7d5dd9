"""Pure: the bytes a terminal sends for keys, as key names (``up``, ``esc``, ``q``...).

The interactive ``fleetd status`` reads whatever is waiting on stdin in one ``read`` and
decodes it here. An arrow is a three-byte sequence (``ESC [ A``, or ``ESC O A`` in a terminal's
application mode) that arrives in one read; a lone ``ESC`` is the Escape key. What this cannot
do: tell an Escape typed right before another key apart from an Alt chord when both arrive in
one read (it reports ``esc`` and then the key, which is what the view wants anyway), or decode
a sequence split across two reads by itself: ``unfinished`` tells the reader that a read ended
inside one (over ssh an arrow's ``ESC`` can arrive alone), and the reader waits a moment for
the rest before it decodes (terminal.read_keys); a lone ``ESC`` is Escape only once that
moment has passed with nothing more.
"""

from __future__ import annotations

ESC = "\x1b"
# the final byte of ``ESC [ ...`` or ``ESC O ...`` -> key
_FINAL = {"A": "up", "B": "down", "C": "right", "D": "left", "H": "home", "F": "end"}
# ``ESC [ n ~`` -> key
_TILDE = {"1": "home", "7": "home", "4": "end", "8": "end", "5": "pgup", "6": "pgdn", "3": "del"}
_CONTROL = {
    "\r": "enter",
    "\n": "enter",
    "\t": "tab",
    "\x7f": "backspace",
    "\x08": "backspace",
    "\x03": "ctrl-c",
}


def decode(data: bytes) -> list[str]:
    """Key names, in order, from what one read returned.

    >>> decode(b"jk\\x1b[A\\x1b[B")
    ['j', 'k', 'up', 'down']
    >>> decode(b"\\x1b"), decode(b"\\x1bq"), decode(b"\\x1b[6~")
    (['esc'], ['esc', 'q'], ['pgdn'])
    """
    text = data.decode("utf-8", errors="replace")
    keys: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == ESC and i + 1 < len(text) and text[i + 1] in "[O":
            name, i = _sequence(text, i + 2)
            if name:
                keys.append(name)
            continue
        if ch == ESC:
            keys.append("esc")
        elif ch in _CONTROL:
            keys.append(_CONTROL[ch])
        elif ch.isprintable():
            keys.append(ch)
        i += 1
    return keys


def unfinished(data: bytes) -> bool:
    """``data`` ends inside an escape sequence: a lone ``ESC``, or ``ESC [`` / ``ESC O`` and
    parameters without the final byte. More bytes may be on their way.

    >>> unfinished(b"j\\x1b"), unfinished(b"\\x1b[1;"), unfinished(b"\\x1b[A"), unfinished(b"q")
    (True, True, False, False)
    """
    at = data.rfind(ESC.encode())
    if at < 0:
        return False
    tail = data[at + 1 :]
    if not tail:
        return True
    if tail[:1] not in (b"[", b"O"):
        return False
    return all(c in b"0123456789;" for c in tail[1:])


def _sequence(text: str, i: int) -> tuple[str | None, int]:
    """The key of a control sequence whose parameters start at ``i``, and where it ends.
    Parameters are digits and ``;`` (a modifier: ``ESC [ 1 ; 5 A`` is Ctrl-Up, read as up)."""
    start = i
    while i < len(text) and (text[i].isdigit() or text[i] == ";"):
        i += 1
    if i >= len(text):
        return None, i  # cut short: drop it
    final, params = text[i], text[start:i].split(";")[0]
    if final == "~":
        return _TILDE.get(params), i + 1
    return _FINAL.get(final), i + 1
