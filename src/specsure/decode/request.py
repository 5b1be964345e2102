"""One prompt being decoded: its output so far, its own caches (a target view and a proposer), its stats.

A request moves through the engine's steps in three calls, so that a scheduler can run many of
them through one batched target forward: ``prefill_call`` / ``draft_call`` say what the request
feeds the target this step, the scheduler runs every request's call together, and ``commit``
verifies what came back, rolls the request's caches back to what it accepted and returns the
step's update. Nothing here knows about other requests.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

import torch

from specsure.decode.completion import Completion, FinishReason, StepUpdate, TokenLogprob
from specsure.decode.detokenize import REPLACEMENT
from specsure.decode.metrics import SpecStats
from specsure.decode.penalties import Penalties, penalised
from specsure.decode.rejection import verify_greedy, verify_sampled
from specsure.decode.structured import Constraint, Grammars
from specsure.decode.token_bias import TokenBias, biased
from specsure.decode.tree import verify_tree
from specsure.models.causal_lm import Call, CausalLM
from specsure.models.forward_output import ForwardOutput
from specsure.models.token_tree import TokenTree, depth, tree_paths
from specsure.proposers.base import Draft, DraftJob, Proposer
from specsure.sampling import SamplingParams, draw, probs_from_logits

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

NO_DRAFT = Draft([])


class Rules:
    """What decides when any request ends and what its text is: the target's EOS ids, tokenizer, context."""

    def __init__(self, eos_token_ids: Sequence[int], tokenizer: "PreTrainedTokenizerBase | None",
                 max_context: int, grammars: Grammars | None = None) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        primary = getattr(tokenizer, "eos_token_id", None)
        self.primary_eos = primary if primary in self.eos_token_ids else None
        """The tokenizer's EOS, whose stop_reason is None; vLLM makes the others (generation_config's
        more EOS ids: Llama 3's <|eom_id|>) stop token ids, named in stop_reason. Without one, no EOS is."""
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.grammars = grammars
        """The engine's structured-output automata (None: no request may ask for structured outputs)."""

    def stop_ids(self, params: SamplingParams) -> frozenset[int]:
        """The token ids that end ``params``' output: its stop_token_ids, and EOS unless ignore_eos."""
        return frozenset(params.stop_token_ids or ()) | (frozenset() if params.ignore_eos else self.eos_token_ids)

    def finished(self, output: list[int], checked: int, params: SamplingParams, cache_len: int) -> FinishReason | None:
        """Trim ``output`` in place at a stop token or max_tokens; return why generation ends, if it does."""
        if stops := self.stop_ids(params):
            # Only the first max_tokens count: a step may commit past them (a bonus token), and a stop
            # token there is one plain decoding never generates. Before min_tokens none is generated.
            for i in range(max(0, checked - 1), min(len(output), params.max_tokens)):
                if output[i] in stops:
                    del output[i + 1:]
                    return "stop"
        if len(output) >= params.max_tokens:
            del output[params.max_tokens:]
            return "length"
        if params.stop and self.tokenizer is not None and self.stop_at(output, params) is not None:
            return "stop"
        if self.max_context and cache_len + 1 >= self.max_context:
            return "length"
        return None

    def stop_at(self, output: list[int], params: SamplingParams) -> tuple[int, int] | None:
        """(start, end) in the decoded output of the first stop string, or None. A stop string that
        ends within the text of the first min_tokens tokens does not count (vLLM checks none before)."""
        assert self.tokenizer is not None and params.stop
        skip = params.skip_special_tokens
        text = self.tokenizer.decode(output, skip_special_tokens=skip)
        early = len(self.tokenizer.decode(output[:params.min_tokens], skip_special_tokens=skip)) \
            if params.min_tokens else 0
        hits = [(at, at + len(s)) for s in params.stop if (at := text.find(s, max(0, early - len(s) + 1))) >= 0]
        return min(hits) if hits else None

    def detokenize(self, output: list[int], params: SamplingParams,
                   finish: FinishReason) -> tuple[str | None, list[int], FinishReason, int | str | None]:
        """The final (text, tokens, finish reason, stop reason): the text cut before a stop string (after
        it with include_stop_str_in_output), and the tokens up to the one that completed it. A stop token
        stays in the tokens; its text leaves the text unless include_stop_str_in_output. The stop
        reason is vLLM's: the stop string or stop token id that ended the output, None for EOS or length."""
        if self.tokenizer is None:
            return None, output, finish, self._stop_token(output, params, finish)
        if params.stop and self.stop_at(output, params) is not None:
            while len(output) > 1 and self.stop_at(output[:-1], params) is not None:
                output = output[:-1]
            # The stop string is looked for in the tokens kept, as plain decoding saw them: in a step's
            # tokens past the stop, another stop string may start earlier and end later.
            found = self.stop_at(output, params)
            assert found is not None
            text = self.tokenizer.decode(output, skip_special_tokens=params.skip_special_tokens)
            cut = text[:found[1] if params.include_stop_str_in_output else found[0]]
            return cut, output, "stop", text[found[0]:found[1]]
        shown = output
        if finish == "stop" and output and output[-1] in self.stop_ids(params) and not params.include_stop_str_in_output:
            shown = output[:-1]  # the token that ended the output; EOS too, which special tokens' text would show
        # A character whose bytes were still arriving when the output ended decodes to U+FFFD,
        # which the model never wrote: vLLM's detokenizer never releases it, nor do the logprobs'
        # token texts (the tokens before a character's last part add "").
        text = self.tokenizer.decode(shown, skip_special_tokens=params.skip_special_tokens)
        return text.rstrip(REPLACEMENT), output, finish, self._stop_token(output, params, finish)

    def _stop_token(self, output: list[int], params: SamplingParams, finish: FinishReason) -> int | None:
        """The stop token id that ended the output, as vLLM names it: the tokenizer's EOS (unless
        ignore_eos) is checked first and gives None, the model's other EOS ids and the request's stop
        token ids their id; an output that ran to its length gives None."""
        if finish != "stop" or not output:
            return None
        last = output[-1]
        if params.ignore_eos or last not in self.eos_token_ids:
            return last if last in (params.stop_token_ids or ()) else None
        return None if self.primary_eos in (None, last) else last


class Request:
    """One prompt's generation; the scheduler drives it step by step."""

    def __init__(self, prompt: list[int], params: SamplingParams, generator: torch.Generator | None,
                 rules: Rules, k: int) -> None:
        self.prompt, self.params, self.generator = prompt, params, generator
        self.rules, self.k = rules, k
        self.output: list[int] = []
        self.stats = SpecStats()
        self.finish: FinishReason | None = None
        self.completion: Completion | None = None
        self.started = time.perf_counter()  # reset when the request gets a slot
        self.prefill_from: Request | None = None
        """Another choice for the same prompt: when both join the batch at the same step, this
        request copies that one's prefill (its KV cache and the prompt's logits) instead of
        computing it again."""
        self.lm: CausalLM | None = None  # set when the scheduler gives the request a slot
        self.proposer: Proposer | None = None
        self._logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self._streamed = 0  # output tokens already handed out; the tokens of a step that ends nothing are final
        self._draft = NO_DRAFT
        self._fed: list[int] = []
        self._parents: list[int] | None = None
        self._start = 0
        self._penalties: Penalties | None = None
        self._bias: TokenBias | None = None
        self._constraint: Constraint | None = None
        self._prompt_logprobs: list[TokenLogprob | None] | None = None
        self.cached_tokens = 0
        """The prompt's first tokens whose KV cache an earlier request left in this slot (prefix caching)."""
        self.prefilled = 0
        """The prompt's first tokens in the slot's cache: cached, then prefilled chunk by chunk."""

    def attach(self, lm: CausalLM, proposer: Proposer | None, cached: int = 0, source: CausalLM | None = None,
               resume: bool = False) -> None:
        """Take a slot's target view and proposer, emptied for this request but for the first ``cached``
        positions of the view's cache (of ``source``'s, copied, when given), which hold the prompt's
        first tokens; ``resume``: prefix caching is on, and the proposer may keep what it shares too."""
        if source is not None:
            assert proposer is None or not proposer.reads_features, "a head's caches cannot come from another slot"
            lm.copy_cache(source)
        if proposer is not None and resume:
            cached = min(cached, proposer.resume(cached))
        elif proposer is not None:
            proposer.reset()
        assert 0 <= cached < len(self.prompt) and list(lm.cached_ids[:cached]) == self.prompt[:cached]
        self.lm, self.proposer, self.cached_tokens, self.prefilled = lm, proposer, cached, cached
        self._prompt_logprobs = [None] if self.params.prompt_logprobs is not None else None
        self._penalties = Penalties(self.params, self.prompt, lm.vocab_size) if penalised(self.params) else None
        self._bias = TokenBias(self.params, lm.vocab_size) if biased(self.params) else None
        spec = self.params.structured_outputs
        if spec is not None:
            assert self.rules.grammars is not None, "Engine.check_params lets structured outputs through only with grammars"
            grammars = self.rules.grammars
            eos = getattr(self.rules.tokenizer, "eos_token_id", None)
            self._constraint = Constraint(grammars.automaton(spec), self.rules.stop_ids(self.params), grammars.spell,
                                          eos if isinstance(eos, int) else None)
        self.started = time.perf_counter()
        if cached:
            lm.crop(cached)
        else:
            lm.reset()

    def prefill_end(self, chunk: int | None) -> int:
        """Where this step's part of the prompt ends: the prompt's end, or with ``chunk`` the next
        multiple of it. The boundaries are the prompt's own, whatever else runs, so a prompt's
        prefill is the same forwards under any load."""
        whole = len(self.prompt)
        return whole if chunk is None else min(whole, (self.prefilled // chunk + 1) * chunk)

    def prefill_call(self, end: int | None = None) -> Call:
        """The forward of the prompt's next part, up to ``end`` (default its end): only its last
        row's logits are read, unless prompt_logprobs scores every row."""
        assert self.lm is not None
        return Call(self.lm, self.prompt[self.prefilled:end],
                    last_logits=None if self.params.prompt_logprobs is not None else 1)

    def commit_chunk(self, out: ForwardOutput, end: int) -> None:
        """A part of the prompt before its last came back: a head observes its features, and
        prompt_logprobs scores its rows (each predicts the prompt's next token)."""
        start = self.prefilled
        assert start < end < len(self.prompt)
        if self.proposer is not None and self.proposer.reads_features:
            self.proposer.observe(self.prompt[start:end], start, out)
        if self._prompt_logprobs is not None:
            top = self.params.prompt_logprobs or 0
            self._prompt_logprobs += _scored(out.logits, self.prompt[start + 1:end + 1], top)
        self.prefilled = end

    def draft_job(self) -> DraftJob | None:
        """What this step's draft needs (None: no proposer, or no room for a draft token)."""
        room = self._room()
        if self.proposer is None or room <= 0:
            return None
        return DraftJob(self.proposer, self.prompt + self.output, room, self.params, self.generator)

    def _room(self) -> int:
        """How many tokens this step may draft: the verify forward must fit the context. Tokens past
        max_tokens are cut after verification, which leaves the kept ones distributed as before."""
        lm, output = self.lm, self.output
        assert lm is not None and output
        return min(self.k, self.params.max_tokens - len(output), (lm.max_context or 1 << 30) - lm.cache_len - 2)

    def draft_call(self, draft: Draft = NO_DRAFT, steer: bool = True) -> Call:
        """The verify forward for this step's draft: the pending token, then the draft (chain or tree);
        ``steer`` False keeps a structured output from drafting its foreseen text (a step that drafts nothing)."""
        lm, output = self.lm, self.output
        assert lm is not None and output
        if self._constraint is not None and self.proposer is not None and steer:  # plain decoding drafts nothing
            draft = self._constraint.steer(draft, max(0, self._room()))
        self._draft, self._start = draft, lm.cache_len
        fed = [output[-1], *draft.token_ids]
        if draft.parents is not None and draft.token_ids:
            # The nodes are in parent-first order, so any prefix of them is a tree: cut to the context.
            fit = max(1, (lm.max_context or 1 << 30) - self._start - 1)
            self._fed, self._parents = fed[:fit], [-1, *draft.parents][:fit]
            return Call(lm, self._fed, tree=TokenTree.from_parents(self._parents))
        self._fed, self._parents = fed, None
        return Call(lm, fed)

    def commit_prefill(self, out: ForwardOutput, shared_from: Request | None = None) -> StepUpdate:
        """The prompt's forward came back: the first output token. The final update if that ends it.

        With ``shared_from``, ``out`` is that request's prefill, whose cache is copied first.
        """
        assert self.lm is not None
        if shared_from is not None:
            assert shared_from.lm is not None and shared_from.prompt == self.prompt
            self.lm.copy_cache(shared_from.lm)
            # ``out`` is the leader's last part. Where it starts matters only to a head and to prompt
            # logprobs, and those copy a leader's prefill only when it was one part, from its cached start.
            self.cached_tokens = self.prefilled = shared_from.cached_tokens
        first = self.prefilled  # ``out``'s first row: after the cached start and any earlier parts
        if self.proposer is not None:
            # ``out`` covers the prompt's last part only: a head observes that part (its entries
            # before it were kept or observed), the others read the tokens, all of them.
            start = first if self.proposer.reads_features else 0
            self.proposer.observe(self.prompt[start:], start, out)
        self.prefilled = len(self.prompt)
        self.output.append(draw(self._target(out.logits[-1:], [[]])[0], self.params, self.generator)[0])
        if self._penalties is not None:
            self._penalties.add(self.output[-1:])
        if self._constraint is not None:
            self._constraint.advance(self.output[-1:])
        self._record(out.logits[-1:], self.output)
        if self._prompt_logprobs is not None:
            self._prompt_logprobs += _scored(out.logits[:-1], self.prompt[first + 1:], self.params.prompt_logprobs or 0)
        return self._after(0)

    def commit(self, out: ForwardOutput) -> StepUpdate:
        """The verify forward came back: verify, roll the caches back, extend the output; the step's update."""
        lm, params, draft, fed, start = self.lm, self.params, self._draft, self._fed, self._start
        assert lm is not None
        if self._parents is not None:
            parents = self._parents
            logits = self._target(out.logits, tree_paths(fed, parents))
            verdict = (verify_tree(None, logits, fed, parents, None) if params.greedy else
                       verify_tree(probs_from_logits(logits, params), None, fed, parents, self.generator))
            self.stats.observe(len(parents) - 1, verdict.accepted, positions=depth(parents))  # every node was drafted
            lm.keep(start, verdict.path)  # the accepted path moves into place; other branches leave the cache
            kept, rows, new = [fed[i] for i in verdict.path], out.pick(verdict.path), verdict.output_ids
            self._record(rows.logits, new)  # the path's rows: where each new token was chosen
        elif not draft.token_ids:
            kept, rows, new = fed, out, [draw(self._target(out.logits[:1], [[]])[0], params, self.generator)[0]]
        else:
            logits = self._target(out.logits, [draft.token_ids[:j] for j in range(len(out.logits))])
            verdict = (verify_greedy(logits, draft.token_ids) if params.greedy else
                       verify_sampled(probs_from_logits(logits, params), draft.token_ids, draft.probs,
                                      self.generator))
            self.stats.observe(len(draft.token_ids), verdict.accepted)
            lm.crop(start + 1 + verdict.accepted)  # rejected positions leave the target cache
            kept, rows, new = fed[: 1 + verdict.accepted], out.rows(1 + verdict.accepted), verdict.output_ids
        if self._parents is None:
            self._record(out.logits[: len(new)], new)
        if self.proposer is not None:
            self.proposer.observe(kept, start, rows)
        before = len(self.output)
        self.output.extend(new)
        if self._penalties is not None:
            self._penalties.add(new)
        if self._constraint is not None:
            self._constraint.advance(new)
        return self._after(before)

    def _target(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """The target's logits ``[n, vocab]`` as plain decoding would sample from them: row i follows the
        output plus the draft tokens ``paths[i]``, so its penalties count those, and while it chooses a
        position below min_tokens the stop tokens get -inf. logit_bias and allowed_token_ids come first,
        as in vLLM, then the penalties, then a structured output's mask; min_tokens' ban comes last and
        spares a row it would leave empty (a structured text that is complete, with nothing allowed
        to follow, keeps its stop tokens). The logprobs stay the raw ones."""
        if self._bias is not None:
            logits = self._bias.apply(logits)
        if self._penalties is not None:
            logits = self._penalties.apply(logits, paths)
        if self._constraint is not None:
            logits = self._constraint.apply(logits, paths)
        early = [i for i, path in enumerate(paths) if len(self.output) + len(path) < self.params.min_tokens]
        banned = [t for t in self.rules.stop_ids(self.params) if t < logits.shape[-1]] if early else []
        if not banned:
            return logits
        rows = torch.tensor(early)
        trial = logits[rows]  # [early rows, vocab]
        trial[:, torch.tensor(banned)] = float("-inf")
        left = torch.isinf(trial).logical_not().any(dim=-1)  # a row with nothing left keeps its stop tokens
        logits = logits.clone()
        logits[rows[left]] = trial[left]
        return logits

    def _record(self, logits: torch.Tensor, tokens: list[int]) -> None:
        """Log-probabilities of ``tokens`` under the target's raw distribution at their rows ([n, vocab])."""
        if self._logprobs is not None:
            self._logprobs += _scored(logits, tokens, self.params.logprobs or 0)

    def _after(self, before: int) -> StepUpdate:
        """The update for the tokens after ``before``; the final one (with the completion) when it ends here."""
        assert self.lm is not None
        output = self.output
        self.finish = self.rules.finished(output, before or 1, self.params, self.lm.cache_len)
        logprobs = self._logprobs
        prompt = self._prompt_logprobs if not self._streamed else None  # on the prompt's update only
        if self.finish is None:
            update = StepUpdate(output[self._streamed:], logprobs=None if logprobs is None else
                                logprobs[self._streamed:], prompt_logprobs=prompt)
            self._streamed = len(output)
            return update
        text, output, finish, stop_reason = self.rules.detokenize(output, self.params, self.finish)
        assert len(output) > self._streamed, "trimming at EOS, max_tokens or a stop string only cuts the last step"
        self.output, self.finish = output, finish
        if logprobs is not None:
            del logprobs[len(output):]  # the tokens trimmed at EOS, max_tokens or a stop string
        self.stats.add_generated(len(output))
        self.stats.add_time(time.perf_counter() - self.started)  # from its prefill, as at batch size 1
        self.completion = Completion(text=text, token_ids=output, finish_reason=finish, stop_reason=stop_reason,
                                     stats=self.stats,
                                     prompt_token_ids=self.prompt, logprobs=logprobs,
                                     prompt_logprobs=self._prompt_logprobs, cached_tokens=self.cached_tokens)
        return StepUpdate(output[self._streamed:], finish, self.completion,
                          logprobs=None if logprobs is None else logprobs[self._streamed:], prompt_logprobs=prompt)


def _scored(logits: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """Each of ``tokens``' log-probability under the raw distribution of its row of ``logits`` [n, vocab],
    with the ``top`` most likely alternatives there."""
    out: list[TokenLogprob] = []
    for start in range(0, len(tokens), SCORED_ROWS):  # a long prompt's float32 copy, a slice at a time
        part = list(tokens[start:start + SCORED_ROWS])
        logp = torch.log_softmax(logits[start:start + SCORED_ROWS].float(), dim=-1)  # [rows, vocab]
        picked = logp.gather(-1, torch.tensor(part, dtype=torch.long).unsqueeze(-1))  # [rows, 1]
        ranks = ((logp > picked).sum(dim=-1) + 1).tolist()
        values, index = logp.topk(top, dim=-1) if top else (logp[:, :0], logp[:, :0].long())
        out += [TokenLogprob(int(token), float(value), tuple(zip(top_index, top_values)), rank)
                for token, value, top_values, top_index, rank
                in zip(part, picked[:, 0].tolist(), values.tolist(), index.tolist(), ranks)]
    return out


SCORED_ROWS = 256
"""Rows of logits turned into log-probabilities at once: a 150,000-token vocabulary's 256 rows are 150 MB."""
