"""Running the configurations: warm-up, then every configuration interleaved per prompt.

Interleaving spreads slow drifts of the machine (thermal state, background load) over every
configuration instead of charging them to whichever ran last. The order changes from prompt to
prompt (``balanced_order``), so that no configuration always goes first or always runs after
the same one.
``run_batched`` then runs each specsure configuration over every prompt at once, batched.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from specsure.bench.results import first_divergence
from specsure.bench.runners import Generation, Runner, SpecsureRunner
from specsure.bench.workload import Prompt


@dataclass(frozen=True)
class Item:
    """A prompt ready to run: its token ids and its new-token cap."""

    prompt: Prompt
    prompt_ids: tuple[int, ...]
    max_tokens: int


def warm_up(runners: Sequence[Runner], item: Item, passes: int, max_tokens: int = 32) -> None:
    """Run every configuration `passes` times on `item` and discard the timings."""
    if passes <= 0:
        return
    with tqdm(total=passes * len(runners), desc="warm-up", unit="run", leave=False) as bar:
        for _ in range(passes):
            for runner in runners:
                bar.set_postfix_str(runner.name)
                runner.generate(item.prompt_ids, min(item.max_tokens, max_tokens))
                bar.update()


def start_pass(runners: Sequence[Runner]) -> None:
    """Before each timed pass, runners that learn across requests forget them (`clear_history`).

    Suffix decoding keeps earlier outputs; without this, a repeat would draft each prompt from
    its own answer in the pass before. Within a pass, each prompt still sees the ones before it.
    """
    for runner in runners:
        clear = getattr(runner, "clear_history", None)
        if clear is not None:
            clear()


def balanced_order(n: int, t: int) -> list[int]:
    """The ``t``-th of a cycle of orders of ``n`` configurations in which each runs at every position
    equally often and, over the cycle (n orders for even n, 2n for odd), follows every other one
    equally often: a Williams design. A plain rotation keeps the same neighbour before each
    configuration, so whatever one leaves behind (caches, another process's spinning threads) would
    always fall on the same row. From 3 configurations on, an order never starts with the one the
    order before it ended with, so no configuration runs twice in a row across prompts either."""
    cycle = _williams(n)
    return list(cycle[t % len(cycle)])


@functools.lru_cache(maxsize=None)
def _williams(n: int) -> tuple[tuple[int, ...], ...]:
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [tuple((c + t) % n for c in first) for t in range(n)]
    if n % 2:  # odd: the mirrored rows balance the neighbours
        rows += [row[::-1] for row in rows]
    if n < 3:
        return tuple(rows)
    # The design holds whatever order its rows run in; find one where no row starts with its
    # predecessor's last configuration, the cycle's wrap included (a small search: 2n rows).
    order = [rows[0]]
    left = rows[1:]

    def extend() -> bool:
        if not left:
            return order[-1][-1] != order[0][0]
        for i, row in enumerate(left):
            if row[0] != order[-1][-1]:
                order.append(left.pop(i))
                if extend():
                    return True
                left.insert(i, order.pop())
        return False

    if not extend():
        raise AssertionError(f"no repeat-free order of the Williams rows for {n} configurations")
    return tuple(order)


def run_interleaved(runners: Sequence[Runner], items: Sequence[Item], repeats: int) -> dict[tuple[str, str], list[Generation]]:
    """Time every configuration on every prompt `repeats` times, interleaved; prompts in order.

    Returns: {(config name, prompt id): [one Generation per repeat]}.
    """
    runs: dict[tuple[str, str], list[Generation]] = {(r.name, it.prompt.id): [] for r in runners for it in items}
    total = repeats * len(items) * len(runners)
    with tqdm(total=total, desc="bench", unit="run") as bar:
        try:
            for repeat in range(repeats):
                start_pass(runners)
                for index, item in enumerate(items):
                    for runner in (runners[i] for i in balanced_order(len(runners), index + repeat)):
                        bar.set_postfix_str(f"{item.prompt.id} {runner.name}")
                        runs[(runner.name, item.prompt.id)].append(runner.generate(item.prompt_ids, item.max_tokens))
                        bar.update()
        except KeyboardInterrupt:
            raise Interrupted(completed(runners, items, runs), bar.n, total) from None
    return runs


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the timed runs, carrying the prompts that every configuration finished.

    A KeyboardInterrupt still, so a caller that does not keep partial results stops as before.
    """

    def __init__(self, runs: dict[tuple[str, str], list[Generation]], done: int, total: int) -> None:
        super().__init__()
        self.runs = runs
        self.done = done
        self.total = total

    def prompt_ids(self) -> set[str]:
        return {prompt_id for _, prompt_id in self.runs}


def completed(runners: Sequence[Runner], items: Sequence[Item],
              runs: dict[tuple[str, str], list[Generation]]) -> dict[tuple[str, str], list[Generation]]:
    """The prompts every configuration ran at least once, each cut to the repeats all of them ran.

    Cutting keeps the comparison fair: a prompt that plain decoding ran twice and a method once
    would otherwise weigh a different median for each.
    """
    kept: dict[tuple[str, str], list[Generation]] = {}
    for item in items:
        counts = [len(runs[(r.name, item.prompt.id)]) for r in runners]
        if min(counts) == 0:
            continue
        for runner in runners:
            kept[(runner.name, item.prompt.id)] = runs[(runner.name, item.prompt.id)][:min(counts)]
    return kept


def run_batched(max_num_seqs: int, runners: Sequence[Runner], items: Sequence[Item],
                runs: dict[tuple[str, str], list[Generation]]) -> dict[str, Any]:
    """Each specsure configuration's prompts all at once, batched: throughput and agreement with batch 1."""

    if max_num_seqs < 1:
        raise ValueError(f"--batched must be >= 1 (or 0 for off), got {max_num_seqs}")
    out: dict[str, Any] = {}
    for runner in runners:
        if not isinstance(runner, SpecsureRunner):
            continue
        runner.clear_history()
        print(f"batched: {runner.name}, {len(items)} prompts, {max_num_seqs} at a time ...", flush=True)
        outputs, seconds = runner.generate_batched([(it.prompt_ids, it.max_tokens) for it in items], max_num_seqs)
        alone = [runs[(runner.name, it.prompt.id)] for it in items]
        mismatches = [{"prompt_id": it.prompt.id, "first_divergence": first_divergence(got, gens[0].token_ids)}
                      for it, got, gens in zip(items, outputs, alone) if tuple(got) != tuple(gens[0].token_ids)]
        serial_s = sum(statistics.median(g.seconds for g in gens) for gens in alone)  # as the batch-1 table
        tokens = sum(len(o) for o in outputs)
        out[runner.name] = {"max_num_seqs": max_num_seqs, "prompts": len(items), "tokens_per_s": tokens / seconds,
                            "speedup_vs_batch1": serial_s / seconds, "exact_match_rate": 1 - len(mismatches) / len(items),
                            "mismatches": mismatches}
    return out
