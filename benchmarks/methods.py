"""The attention variants the quality benchmark compares, switched on one loaded model.

vanilla: the model as trained. window: Λ-mask without starting tokens (n_starting = 0). lambda_only and
ceiling_only: the paper's Fig. 5 ablations, from the dense reference. lminfinite / lminfinite_topk: the
library as users run it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

import lminfinite
from lminfinite.reference import ReferenceModel

NLL_METHODS = ("vanilla", "window", "lambda_only", "ceiling_only", "lminfinite", "lminfinite_topk")
PASSKEY_METHODS = ("vanilla", "truncate", "lminfinite", "lminfinite_topk")


class Variants:
    """Hands out the model in the state each method needs; references are built once, lazily."""

    def __init__(self, model, config: lminfinite.LMInfiniteConfig, topk: int, topk_from_layer: int):
        self.model, self.config = model, config
        self.topk_config = replace(config, topk=topk, topk_from_layer=topk_from_layer)
        self._references: dict[str, ReferenceModel] = {}

    @property
    def window(self) -> int:
        return self.config.window or self.model.config.max_position_embeddings

    def model_for(self, method: str):
        """The model to call for ``method``; LM-Infinite methods get the same weights, re-hooked."""
        if method in ("vanilla", "truncate"):
            return lminfinite.disable(self.model)
        if method == "window":
            return lminfinite.enable(self.model, replace(self.config, n_starting=0))
        if method == "lminfinite":
            return lminfinite.enable(self.model, self.config)
        if method == "lminfinite_topk":
            return lminfinite.enable(self.model, self.topk_config)
        if method in ("lambda_only", "ceiling_only"):
            if method not in self._references:
                variant = "lambda_only" if method == "lambda_only" else "ceiling_only"
                self._references[method] = ReferenceModel(
                    lminfinite.disable(self.model), self.config, variant=variant, dtype=torch.float32
                )
            return self._references[method].model
        raise ValueError(f"unknown method {method!r}")

    def uses_infinite_cache(self, method: str) -> bool:
        return method.startswith("lminfinite")
