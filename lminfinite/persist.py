"""Save an InfiniteCache to one safetensors file and load it back exactly, e.g. to resume a long context later.

What a cache holds is tensors (each layer's start keys, ring and middle store) and a few counters (seen,
win_start, frame); with the model's rotation they determine every later forward, so restoring them bit for bit
gives bit-identical logits. The counters and an *identity* (the LM-Infinite settings that shape attention, the
model's layer count, KV heads, head_dim and dtype) travel as JSON in the file's metadata: a cache is refused by a
model it was not built for (CacheMismatch) rather than silently attended with other settings. That JSON is
cache_record.py's dataclasses as dicts; which tensors and counters a layer holds, the layer says itself
(InfiniteLayer.export and restore, layer_state.py).

Saving is atomic: the file is written beside ``path``, synced, then renamed onto it, so a crash mid-save leaves
the previous file whole.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import safetensors
import torch

from .cache import InfiniteCache
from .cache_record import CONFIG_FIELDS, CacheFileError, CacheIdentity, CacheInfo, CacheMismatch
from .layer_state import MIDDLE_TENSORS, TENSORS, LayerCounters
from .tensor_file import TensorFile, write_tensors
from .kv_bytes import KVShape
from .modes import outside_inference_mode
from .model_state import get_state

INFO_KEY = "lminfinite.cache"  # the metadata key holding the cache's info JSON; the caller's keys go beside it


# -- state: tensors and counters ----------------------------------------------------------------------------
def cache_state(
    cache: InfiniteCache, *, middle_dtype: torch.dtype | None = None, copy: bool = True
) -> tuple[dict[str, torch.Tensor], dict]:
    """Every tensor and counter that rebuilds ``cache`` exactly; ``info`` is JSON-ready (cache_record.CacheInfo
    as a dict).

    ``copy=True``: contiguous CPU copies, a snapshot that later forwards cannot change. ``copy=False``: the
    cache's own tensors (views, maybe on a GPU), for writing them out at once (``tensor_file.write_tensors``
    does that without copying them whole): no second copy of a cache of gigabytes.

    ``middle_dtype`` (e.g. torch.bfloat16) stores the middle store smaller; it is converted back on restore,
    so recall then scores rounded keys: close, no longer exact.
    """
    initialized = [layer for layer in cache.layers if layer.is_initialized]
    batch, kv_heads, _, head_dim = initialized[0].ring_k.shape if initialized else (None,) * 4
    dtype = initialized[0].dtype if initialized else None
    middle_dtype = _floating(middle_dtype) if middle_dtype is not None else dtype
    tensors: dict[str, torch.Tensor] = {}
    take = _cpu_copy if copy else _as_is
    layers = tuple(_layer_state(layer, f"layers.{i}.", dtype, middle_dtype, tensors, take)
                   for i, layer in enumerate(cache.layers))
    identity = CacheIdentity(**{name: getattr(cache.config, name) for name in CONFIG_FIELDS},
                             num_layers=len(cache.layers), num_kv_heads=kv_heads, head_dim=head_dim,
                             dtype=_dtype_name(dtype))
    info = CacheInfo(
        identity=identity, topk=cache.topk, model_topk=cache.config.topk,  # topk None: the cache follows the model's k
        keep_middle=cache.keeps_middle,
        offload_middle=any(layer.middle is not None and layer.middle.device is not None for layer in cache.layers),
        batch_size=batch, middle_dtype=_dtype_name(middle_dtype), layers=layers,
    )
    return tensors, info.to_dict()


def _layer_state(layer, prefix: str, dtype, middle_dtype, tensors: dict, take) -> LayerCounters:
    """One layer's counters; its tensors go into ``tensors`` (the middle store: only the rows in use)."""
    counters, own = layer.export()
    for name, tensor in own.items():
        tensors[prefix + name] = take(tensor, middle_dtype if name in MIDDLE_TENSORS else dtype)
    return counters


def restore_cache(model, tensors: dict[str, torch.Tensor], info: dict, *, device=None) -> InfiniteCache:
    """A new InfiniteCache of ``model`` holding exactly what ``cache_state`` recorded; rings on ``device``
    (default: the model's), the middle store on the CPU where the saved cache offloaded it."""
    state = get_state(model)
    if state is None:
        raise ValueError("restore_cache needs an LM-Infinite model: call lminfinite.enable(model) first")
    record = CacheInfo.from_dict(info)
    _check_identity(model, state, record)
    _check_tensor_names(tensors, record)
    device = torch.device(device) if device is not None else _model_device(model)
    cache = InfiniteCache(
        model, keep_middle=record.keep_middle, offload_middle=record.offload_middle, topk=record.topk
    )
    with outside_inference_mode():  # the cache is written in place later, whatever mode this runs in
        for i, (layer, saved) in enumerate(zip(cache.layers, record.layers)):
            _restore_layer(layer, i, saved, tensors, record, device)
    return cache


def _restore_layer(layer, i: int, saved: LayerCounters, tensors, info: CacheInfo, device: torch.device) -> None:
    if (layer.middle is None) != (saved.middle is None):
        raise CacheFileError(
            f"layer {i}: middle store {saved.middle!r} contradicts keep_middle={info.keep_middle} "
            f"and topk_from_layer={info.identity.topk_from_layer}"
        )
    dtype = getattr(torch, info.identity.dtype) if saved.initialized else None
    middle_dtype = getattr(torch, info.middle_dtype) if saved.initialized else None

    def read(name: str, rows: int) -> torch.Tensor:
        return _checked(tensors, f"layers.{i}.{name}", info, rows, middle_dtype if name in MIDDLE_TENSORS else dtype)

    layer.restore(saved, read, dtype, device)


# -- files: one safetensors file, written atomically -------------------------------------------------------
def save_cache(cache: InfiniteCache, path, *, metadata: dict[str, str] | None = None,
               middle_dtype: torch.dtype | None = None) -> None:
    """Write ``cache`` (and the caller's string ``metadata``) to ``path``; the old file stays whole until the new
    one is complete on disk."""
    metadata = dict(metadata or {})
    if INFO_KEY in metadata or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError(f"metadata must map str to str and may not use the key {INFO_KEY!r}")
    tensors, info = cache_state(cache, middle_dtype=middle_dtype, copy=False)  # written at once, piece by piece
    metadata[INFO_KEY] = json.dumps(info)
    write_tensors(tensors, metadata, Path(path))


def load_cache(model, path, *, device=None) -> tuple[InfiniteCache, dict[str, str]]:
    """The cache saved at ``path``, restored for ``model``, and the caller's metadata saved with it. Tensors are
    read one at a time as the layers are filled (tensor_file.TensorFile)."""
    try:
        with TensorFile(path) as tensors:
            metadata = dict(tensors.metadata)
            if INFO_KEY not in metadata:
                raise CacheFileError(f"{path} is a safetensors file but no LM-Infinite cache (no {INFO_KEY!r} metadata)")
            try:
                info = json.loads(metadata.pop(INFO_KEY))
            except json.JSONDecodeError as error:
                raise CacheFileError(f"{path}: the cache info is not valid JSON ({error})") from error
            try:
                return restore_cache(model, tensors, info, device=device), metadata
            except CacheFileError as error:
                raise CacheFileError(f"{path}: {error}") from error
    except safetensors.SafetensorError as error:
        raise CacheFileError(f"{path} is truncated or corrupt (safetensors: {error})") from error


# -- checks: another model is a CacheMismatch, a tensor that does not fit a CacheFileError --------------------
def _check_identity(model, state, info: CacheInfo) -> None:
    """Refuse a model whose attention over this cache would differ from the saving model's."""
    identity = asdict(info.identity)
    current = {name: getattr(state.config, name) for name in CONFIG_FIELDS}
    current["num_layers"] = state.num_layers
    if identity["dtype"] is not None:  # shapes and dtype are known once a layer holds tensors
        shape = KVShape.from_config(model.config)
        current.update(num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim, dtype=_dtype_name(_model_dtype(model)))
    if info.topk is None:  # the cache recalls with the model's k
        identity, current = {**identity, "topk": info.model_topk}, {**current, "topk": state.config.topk}
    for name, value in current.items():
        if identity[name] != value:
            raise CacheMismatch(
                f"the cache was saved for {name}={identity[name]!r}, this model has {name}={value!r}: "
                "restore it into the model (and LM-Infinite config) it was built with"
            )


def _check_tensor_names(tensors, info: CacheInfo) -> None:
    expected = set()
    for i, layer in enumerate(info.layers):
        if layer.initialized:
            expected.update(f"layers.{i}.{name}" for name in TENSORS)
        if layer.middle:
            expected.update(f"layers.{i}.{name}" for name in MIDDLE_TENSORS)
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CacheFileError(f"missing tensor {missing[0]}{more}")
    if unexpected:
        raise CacheFileError(f"unexpected tensor {unexpected[0]}: the cache info does not account for it")


def _checked(tensors, name: str, info: CacheInfo, rows: int, dtype: torch.dtype) -> torch.Tensor:
    tensor = tensors[name]
    identity = info.identity
    shape = (info.batch_size, identity.num_kv_heads, rows, identity.head_dim)
    if not isinstance(tensor, torch.Tensor):
        raise CacheFileError(f"{name} is a {type(tensor).__name__}, not a tensor")
    if tuple(tensor.shape) != shape or tensor.dtype != dtype:
        got = f"{tuple(tensor.shape)} {_dtype_name(tensor.dtype)}"
        raise CacheFileError(f"tensor {name} is {got}, expected {shape} {_dtype_name(dtype)}")
    if not _all_finite(tensor):
        raise CacheFileError(f"tensor {name} holds NaN or infinite values: every later token would attend to them")
    return tensor


_FINITE_CHUNK = 1 << 22  # elements checked at once: the check's scratch memory stays small for any cache


def _all_finite(tensor: torch.Tensor) -> bool:
    """No NaN or infinity in ``tensor`` (keys and values a model computed never hold one), checked in chunks
    so a middle store of gigabytes needs no mask of its size."""
    flat = tensor.reshape(-1)
    return all(bool(torch.isfinite(flat[start:start + _FINITE_CHUNK]).all())
               for start in range(0, flat.numel(), _FINITE_CHUNK))


# -- small helpers ----------------------------------------------------------------------------------------
def _cpu_copy(tensor: torch.Tensor, dtype) -> torch.Tensor:
    """A contiguous CPU copy, never a view of the cache (which goes on changing in place)."""
    return tensor.detach().to("cpu", dtype, copy=True).contiguous()


def _as_is(tensor: torch.Tensor, dtype) -> torch.Tensor:
    """The tensor itself (converted only when another dtype is asked for)."""
    return tensor.detach() if tensor.dtype == dtype else tensor.detach().to(dtype)


def _floating(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"middle_dtype must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _model_device(model) -> torch.device:
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else next(model.parameters()).device


def _model_dtype(model) -> torch.dtype:
    dtype = getattr(model, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else next(model.parameters()).dtype
