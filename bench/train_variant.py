"""`specsure train` with one experimental change the CLI does not offer, for data-size and label runs.

    .venv/bin/python bench/train_variant.py --share 0.5 -- train --method eagle3 ... --out DIR
    .venv/bin/python bench/train_variant.py --hard-weight 0.5 -- train --method eagle3 ... --out DIR

- ``--share F``: train on a seeded random share F of the samples the data phase returns (the
  cached ones), so data sizes compare on the same data. The held-out tenth is then a tenth of
  the share, so its figures are not comparable with a full run's; the bench's prompts are.
- ``--add-samples FILE``: also train on the samples of another run's data cache
  (``$XDG_CACHE_HOME/specsure/train/<key>.safetensors``, made with the same aux layers), those whose
  prompt is not among this run's, so two data sets with prompts in common join without repeats.
- ``--hard-weight W``: the soft labels become (1 - W) x the target's distribution over the draft
  vocabulary + W x a one-hot on its most probable draft token, so W = 1 trains on the target's
  greedy token alone (greedy verification accepts only that token).

Everything else is `specsure train` as it is (docs/training.md, "A wider head, a larger draft
vocabulary and less data" and "Soft labels or the target's greedy token").
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

import specsure.cli.train_data as train_data
import specsure.train.labels as labels
from specsure.cli.main import main as specsure_main


def _share(fraction: float) -> None:
    full = train_data.training_samples

    def subset(*args: object, **kwargs: object) -> tuple:
        samples, key, data = full(*args, **kwargs)
        count = round(len(samples) * fraction)
        picked = [samples[i] for i in sorted(random.Random(0).sample(range(len(samples)), count))]
        tokens = sum(s.token_ids.shape[0] for s in picked)
        print(f"share {fraction}: {len(picked)} of {len(samples)} samples, {tokens} tokens", flush=True)
        return picked, key, dict(data, prompts=len(picked), tokens=tokens, share=fraction)

    train_data.training_samples = subset


def _added(path: str) -> None:
    from pathlib import Path

    from specsure.train.cache import cached_samples

    full = train_data.training_samples

    def unreadable() -> list:
        raise SystemExit(f"--add-samples {path}: not a readable data cache")

    def union(*args: object, **kwargs: object) -> tuple:
        samples, key, data = full(*args, **kwargs)
        extra, _ = cached_samples(Path(path).parent, Path(path).stem, unreadable)
        own = {tuple(s.token_ids[: s.prompt_len].tolist()) for s in samples}
        new = [s for s in extra if tuple(s.token_ids[: s.prompt_len].tolist()) not in own]
        joined = samples + new
        tokens = sum(s.token_ids.shape[0] for s in joined)
        print(f"add-samples: {len(new)} of {len(extra)} samples from {path} are new; {len(joined)} samples, "
              f"{tokens} tokens", flush=True)
        return joined, key, dict(data, prompts=len(joined), tokens=tokens, added_samples=path, added=len(new))

    train_data.training_samples = union


def _hard(weight: float) -> None:
    soft = labels.DraftLabels.probs

    def mixed(self: labels.DraftLabels, sample: object, first: int, end: int) -> torch.Tensor:
        p = soft(self, sample, first, end)
        hot = torch.zeros_like(p).scatter_(1, p.argmax(1, keepdim=True), 1.0)
        return (1 - weight) * p + weight * hot

    labels.DraftLabels.probs = mixed  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--share", type=float, help="the share of the samples to train on, in (0, 1]")
    parser.add_argument("--hard-weight", type=float, help="weight in [0, 1] of the one-hot greedy label")
    parser.add_argument("--add-samples", metavar="FILE", help="another data cache's samples to train on as well")
    parser.add_argument("specsure", nargs=argparse.REMAINDER, help="-- then the specsure command line")
    args = parser.parse_args()
    argv = args.specsure[1:] if args.specsure[:1] == ["--"] else args.specsure
    if args.share is not None:
        if not 0 < args.share <= 1:
            parser.error(f"--share {args.share}: must be in (0, 1]")
        _share(args.share)
    if args.add_samples is not None:
        _added(args.add_samples)
    if args.hard_weight is not None:
        if not 0 <= args.hard_weight <= 1:
            parser.error(f"--hard-weight {args.hard_weight}: must be in [0, 1]")
        _hard(args.hard_weight)
    return specsure_main(argv)


if __name__ == "__main__":
    sys.exit(main())
