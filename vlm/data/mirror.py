"""The text of a mirror image: "left" and "right" swapped, as a horizontal flip swaps the scene's sides."""

import re

_SIDE_WORD = re.compile(r"\b(left|right)(most)?\b(?! of way)", re.IGNORECASE)  # "right of way" is no side


def _swapped_side(match: re.Match) -> str:
    word = match.group(1)
    other = "right" if word.lower() == "left" else "left"
    if word.isupper():
        other = other.upper()
    elif word[0].isupper():
        other = other.capitalize()
    return other + (match.group(2) or "")


def swap_left_right(text: str) -> str:
    """The text describing the mirrored scene: "left" <-> "right", case kept."""
    return _SIDE_WORD.sub(_swapped_side, text)
