"""`specsure train` with one experimental change the CLI does not offer, for head-size and data-size runs.

    .venv/bin/python bench/train_variant.py --intermediate 3072 -- train --method eagle3 ... --out DIR
    .venv/bin/python bench/train_variant.py --share 0.5 -- train --method eagle3 ... --out DIR

- ``--intermediate N``: a new EAGLE-3 head's MLP gets N units instead of the target's
  ``intermediate_size``; its ``config.json`` is written with N, so the engine and
  `head_acceptance.py` load it.
- ``--share F``: train on a seeded random share F of the samples the data phase returns (the
  cached ones), so data sizes compare on the same data. The held-out tenth is then a tenth of
  the share, so its figures are not comparable with a full run's; the bench's prompts are.

Everything else is `specsure train` as it is (docs/training.md, "A wider head, a larger draft
vocabulary and less data").
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import types
from pathlib import Path

import specsure.cli.train_data as train_data
import specsure.train.eagle3 as eagle3
from specsure.cli.main import main as specsure_main


def _wider(units: int) -> None:
    def deepcopy(value: object) -> object:
        out = copy.deepcopy(value)
        if hasattr(out, "intermediate_size"):  # the target's text config, copied for the new head
            out.intermediate_size = units
        return out

    eagle3.copy = types.SimpleNamespace(deepcopy=deepcopy)  # type: ignore[assignment]


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


def _fix_config(argv: list[str], units: int) -> None:
    """The head writer copies the target's sizes into config.json; the head's own MLP is wider."""
    out = Path(argv[argv.index("--out") + 1])
    path = out / "config.json"
    config = json.loads(path.read_text())
    config["intermediate_size"] = units
    path.write_text(json.dumps(config, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intermediate", type=int, help="a new EAGLE-3 head's MLP units")
    parser.add_argument("--share", type=float, help="the share of the samples to train on, in (0, 1]")
    parser.add_argument("specsure", nargs=argparse.REMAINDER, help="-- then the specsure command line")
    args = parser.parse_args()
    argv = args.specsure[1:] if args.specsure[:1] == ["--"] else args.specsure
    if args.intermediate is not None:
        _wider(args.intermediate)
    if args.share is not None:
        if not 0 < args.share <= 1:
            parser.error(f"--share {args.share}: must be in (0, 1]")
        _share(args.share)
    code = specsure_main(argv)
    if code == 0 and args.intermediate is not None:
        _fix_config(argv, args.intermediate)
    return code


if __name__ == "__main__":
    sys.exit(main())
