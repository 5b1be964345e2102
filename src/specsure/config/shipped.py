"""The draft heads shipped with specsure for its packaged default model (made by `make heads`).

When the target is the packaged default and the user names ``eagle3`` or ``mtp`` without a
``model``, resolution fills ``model`` with the shipped head and says so (source ``default``).
An explicit ``model``, or ``"model": null``, is never replaced. The folders live inside the
package (``specsure/heads/``), so an installed specsure finds them; docs/training.md says how
they were trained and from what.
"""

from __future__ import annotations

from pathlib import Path

from specsure.config.token_tree import DraftTree

HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"
"""Where the shipped head folders are: ``src/specsure/heads/`` in a checkout."""

SHIPPED: dict[str, str] = {"eagle3": "smollm2-135m-eagle3", "mtp": "smollm2-135m-mtp"}
"""Method -> folder name of the head trained for SmolLM2-135M-Instruct."""

SHIPPED_TREE: dict[str, DraftTree] = {"eagle3": DraftTree([(0,), (1,)]), "mtp": DraftTree([(0,), (1,)])}
"""The token tree each shipped head drafts when the user sets neither num_speculative_tokens nor a
tree: the best measured on the bench (BENCHMARKS.md, "Token trees" and "the float32 C kernel"),
for both heads the first two choices of one draft step (the first three were best until a verify
row stopped being nearly free on the AVX2 machine). k is its node count."""


def shipped_head(method: str) -> str | None:
    """The shipped head's folder for ``method`` on the default model, or None when there is none."""
    name = SHIPPED.get(method)
    if name is None:
        return None
    folder = HEADS_DIR / name
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        return None
    return str(folder)
