"""LM-Infinite hyper-parameters (paper §4 and App. A), validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass

WINDOW_KERNELS = ("auto", "cpu-flash", "efficient", "flash", "flex", "float32")
RECALL_KERNELS = ("auto", "torch", "triton")


@dataclass
class LMInfiniteConfig:
    """How a model attends beyond its pre-training length.

    n_starting: the first tokens every query may attend to (§4 "Λ-shaped mask"; 5–100 work, 0 breaks).
    window: L_pretrain, the most recent tokens each query sees and the distance ceiling. ``None`` means
        "take the model's ``max_position_embeddings``" and is resolved by :func:`lminfinite.enable`.
    topk: middle tokens recalled per query and head (App. A.3); 0 switches recall off.
    topk_from_layer: recall only in layers with index >= this (the paper's h = 5 for Llama-2).
    topk_distance: the distance at which recalled middle tokens are scored; ``None`` means ``window // 2``.
    offload_middle: keep evicted keys/values in pinned CPU pages; only the selected rows travel to the accelerator.
    middle_device_share: without offload, on a GPU, the share of the GPU memory free when a cache is made that its
        middle stores may hold; the rows beyond go to pinned CPU pages (middle_store.py). A CPU model keeps them all.
    recall_scan_copy: a model running in float32 on the CPU also keeps a bfloat16 copy of its middle keys,
        which recall scans instead (scan_copy.py): the same tokens are recalled, decoding with recall runs
        faster at long contexts, and the middle store takes a quarter more memory.
    window_kernel: what computes a prefill's window span, and a decode step's with top-k: ``auto`` (the fastest
        measured kernel this device and PyTorch build run correctly), ``cpu-flash``, ``efficient`` (CUDA),
        ``flash`` (CUDA), ``flex`` (a prefill's only: a decode step takes ``auto``'s) or ``float32`` (fused.py,
        kernel_choice.py).
    recall_kernel: what scans a decode step's middle store for recall: ``auto`` (Triton's kernels on a CUDA device
        where Triton is installed and they agree with float64 there, else PyTorch's operators), ``torch`` or
        ``triton`` (recall_kernel.py).
    """

    n_starting: int = 10
    window: int | None = None
    topk: int = 0
    topk_from_layer: int = 5
    topk_distance: int | None = None
    offload_middle: bool = False
    middle_device_share: float = 0.8
    recall_scan_copy: bool = True
    window_kernel: str = "auto"
    recall_kernel: str = "auto"

    def __post_init__(self) -> None:
        require_int("n_starting", self.n_starting, minimum=0)
        if self.window is not None:
            require_int("window", self.window, minimum=1)
        require_int("topk", self.topk, minimum=0)
        require_int("topk_from_layer", self.topk_from_layer, minimum=0)
        if self.topk_distance is not None:
            require_int("topk_distance", self.topk_distance, minimum=0)
            if self.window is not None and self.topk_distance > self.window:
                raise ValueError(
                    f"topk_distance={self.topk_distance} exceeds window={self.window}: middle tokens would be "
                    "scored at a distance the model never saw in pre-training"
                )
        for name in ("offload_middle", "recall_scan_copy"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        share = self.middle_device_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise ValueError(f"middle_device_share must be a number in [0, 1], got {share!r}")
        if self.window_kernel not in WINDOW_KERNELS:
            raise ValueError(f"window_kernel must be one of {', '.join(WINDOW_KERNELS)}, got {self.window_kernel!r}")
        if self.recall_kernel not in RECALL_KERNELS:
            raise ValueError(f"recall_kernel must be one of {', '.join(RECALL_KERNELS)}, got {self.recall_kernel!r}")

    def resolved(self, trained_span: int) -> "LMInfiniteConfig":
        """A copy with ``window`` (default: the model's ``trained_span``, patch.trained_span) and ``topk_distance``
        filled in."""
        window = self.window if self.window is not None else int(trained_span)
        distance = self.topk_distance if self.topk_distance is not None else window // 2
        return LMInfiniteConfig(
            n_starting=self.n_starting,
            window=window,
            topk=self.topk,
            topk_from_layer=self.topk_from_layer,
            topk_distance=distance,
            offload_middle=self.offload_middle,
            middle_device_share=self.middle_device_share,
            recall_scan_copy=self.recall_scan_copy,
            window_kernel=self.window_kernel,
            recall_kernel=self.recall_kernel,
        )

    @property
    def window_(self) -> int:
        """The window, for code that runs only after :meth:`resolved`."""
        if self.window is None:
            raise ValueError("window is unresolved; call LMInfiniteConfig.resolved(trained_span) first")
        return self.window

    def uses_topk(self, layer_idx: int) -> bool:
        return self.topk > 0 and layer_idx >= self.topk_from_layer


def require_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def suggested_topk_from_layer(num_layers: int) -> int:
    """The paper's h = 5 for Llama-2's 32 layers, scaled down for shallower models, never below 1.

    Recall needs heads that match on what earlier layers wrote into each token (its neighbours); the
    first layer only builds those features, so even a 4-layer model recalls from layer 1 on.
    """
    return min(5, max(1, num_layers // 6))
