"""A token whose bytes are a piece of one character (a multi-byte character split between
tokens: `e2 82` of `€`, the pieces of an emoji) has no text of its own: decoded, it is
U+FFFD, the same for every such piece. It is shown by its bytes instead, `<e2 82>`,
everywhere a token's text is shown (the panel, the step-mode die, the branch picker, the
token search, the transcript's token info)."""

from __future__ import annotations


def partial_character(raw: bytes) -> bool:
    """The bytes are not whole UTF-8 characters."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def byte_face(raw: bytes) -> str:
    """`<e2 82>`: the bytes in hex, as the wire's `bytes` lists them."""
    return "<" + " ".join(f"{b:02x}" for b in raw) + ">"


def vocabulary_text(raw: bytes) -> str:
    """A token's text for a list of the vocabulary: its characters, or its bytes
    (`<e2 82>`) when they are a piece of one."""
    return byte_face(raw) if partial_character(raw) else raw.decode("utf-8")


def partial_bytes(raw: bytes | None) -> bytes | None:
    """`raw` when it is a piece of a character (what Candidate.piece_bytes holds), else None."""
    return raw if raw is not None and partial_character(raw) else None
