"""The one factory: method name -> proposer builder. A new method is a module plus a line here."""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Callable

from specsure.config.compat import check_same_vocab
from specsure.config.vocabulary import SharedTokenizer, compare_vocabs
from specsure.config.errors import ConfigError
from specsure.proposers.base import Proposer
from specsure.proposers.head_chain import HeadChainProposer

if TYPE_CHECKING:
    from specsure.config.resolution import Resolution
    from specsure.models.loading import LoadedModel

Builder = Callable[["Resolution", "LoadedModel", str], Proposer]

logger = logging.getLogger(__name__)

# "module:function" of each method's builder, imported only when that method runs.
REGISTRY: dict[str, str] = {
    "ngram": "specsure.proposers.factory:build_ngram",
    "draft_model": "specsure.proposers.factory:build_draft_model",
    "eagle": "specsure.proposers.eagle:build",
    "eagle3": "specsure.proposers.eagle3:build",
    "mtp": "specsure.proposers.mtp:build",
    "suffix": "specsure.proposers.suffix:build",
}


def build_proposer(res: "Resolution", target: "LoadedModel", dtype: str) -> Proposer | None:
    """Build the proposer the Resolution names (None when speculation is off)."""
    if res.config is None:
        return None
    module_name, func_name = REGISTRY[res.config.method].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ConfigError(f"method {res.config.method!r} is not available in this build of specsure "
                          f"({module_name} is missing).") from None
    builder: Builder = getattr(module, func_name)
    proposer = builder(res, target, dtype)
    if res.config.speculative_token_tree is not None:
        assert isinstance(proposer, HeadChainProposer), "the config allows a tree only for the head methods"
        proposer.use_tree(res.config.speculative_token_tree)
    return proposer


def build_ngram(res: "Resolution", target: "LoadedModel", dtype: str) -> Proposer:
    from specsure.proposers.ngram import NgramProposer

    config = res.config
    assert config is not None and config.prompt_lookup_min and config.prompt_lookup_max
    return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max, config.prompt_lookup_branches or 1)


def build_draft_model(res: "Resolution", target: "LoadedModel", dtype: str) -> Proposer:
    from specsure.models.errors import ModelLoadError
    from specsure.models.loading import load_model
    from specsure.proposers.draft_model import DraftModelProposer
    from specsure.proposers.head_blocks import int8_wanted

    assert res.config is not None and res.config.model is not None
    # with int8 activations where the draft's blocks can have them, whether or not the target has them:
    # a cheaper draft step; its arithmetic decides only the proposals, the target's every output token
    int8 = int8_wanted(target.lm)
    try:
        draft = load_model(res.config.model, dtype=_same_dtype(target, dtype), int8_activations=int8,
                           int8_required=False, release_weights=True)
    except ModelLoadError as exc:
        raise ModelLoadError(f"draft (the speculative config's model): {exc}") from None
    if int8 and not draft.lm.int8_matrices:
        logger.info("draft model %s: no weight matrix can have int8 activations (forward: %s); its products stay "
                    "%s (they decide only the proposals)", res.config.model, draft.lm.path,
                    str(draft.lm.dtype).removeprefix("torch."))
    check_same_vocab(target.lm.vocab_size, draft.lm.vocab_size, target=target.path, draft=res.config.model,
                     tokenizers=lambda: _shared_tokenizer(target, draft))
    if draft.lm.max_context and (draft.lm.max_context < target.lm.max_context or not target.lm.max_context):
        # as vLLM bounds speculation by the draft's length: lossless, but past it the request decodes
        # plainly, which a user comparing speeds on long contexts should know before they measure
        logger.warning("draft model %s holds %d positions (max_position_embeddings), the target %s: a request "
                       "whose context passes %d decodes without drafts from there on", res.config.model,
                       draft.lm.max_context, target.lm.max_context or "no limit", draft.lm.max_context)
    return DraftModelProposer(draft.lm, target.lm.vocab_size)


def _shared_tokenizer(target: "LoadedModel", draft: "LoadedModel") -> SharedTokenizer:
    if target.tokenizer is None or draft.tokenizer is None:
        role = "target" if target.tokenizer is None else "draft"
        return SharedTokenizer(None, f"the {role} has no tokenizer to compare")
    added = {*target.tokenizer.get_added_vocab(), *draft.tokenizer.get_added_vocab()}  # special and chat tokens
    return compare_vocabs(target.tokenizer.get_vocab(), draft.tokenizer.get_vocab(), "their tokenizers", added)


def _same_dtype(target: "LoadedModel", dtype: str) -> str:
    """The draft runs in the target's dtype, so p and q come from the same numerics."""
    return str(target.lm.dtype).removeprefix("torch.") if dtype == "auto" else dtype
