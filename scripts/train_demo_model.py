#!/usr/bin/env python
"""Train the shipped demo model (demo_model/) from scratch on this machine.

Reproducible: fixed seed, fixed step counts, data from the local Python
standard library.  Takes about 45 minutes on one CPU thread; not run in CI.

    python scripts/train_demo_model.py --out demo_model --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.train import TrainConfig, train  # noqa: E402


def _flag(text: str) -> bool:
    return text.lower() in ("1", "true", "yes", "on")


def parse_args(argv=None) -> TrainConfig:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in fields(TrainConfig):
        default = getattr(defaults, f.name)
        if f.name == "threads":
            default = os.cpu_count() or 1
        kind = _flag if isinstance(default, bool) else type(default)
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=default, help=f"default: {default}")
    return TrainConfig(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    train(parse_args())
