"""``--seq-len`` as estimate and measure read it (:func:`sequence_length`): a number of tokens, never ``max``."""

from __future__ import annotations

import typer


def sequence_length(value: str | int) -> int:
    """A ``--seq-len`` of estimate and measure: a whole number from 1; ``max`` is refused pointing to the commands
    that search the longest length (it is tune's and the API's)."""
    text = str(value).strip()
    if text.lower() == "max":
        raise typer.BadParameter(
            "max is searched by dstune estimate --max-seq-len (the longest that fits) and dstune tune --seq-len max "
            "(by measurement); here give a number of tokens"
        )
    try:
        length = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a whole number of tokens") from None
    if length < 1:
        raise typer.BadParameter(f"{length} is below 1 token")
    return length
