"""The tiny model's tokenizer: bytes. Tokens 0..255 are the UTF-8 bytes of the text; the preset's
``bos_token_id`` and ``eos_token_id`` (256, 257) lie above them and decode to nothing."""

from __future__ import annotations


def encode(text: str | bytes) -> list[int]:
    """Byte-level tokens (0..255): the bytes themselves, or the UTF-8 of ``text`` with the
    surrogate escapes Python decodes undecodable bytes into (command-line arguments, file names)
    turned back into those bytes."""
    return list(text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape"))


def decode(tokens: list[int]) -> str:
    """The text of ``tokens``; special tokens (>= 256) are dropped, broken UTF-8 is replaced."""
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")
