"""Save an InfiniteCache to one safetensors file and load it back exactly, e.g. to resume a long context later.

What a cache holds is tensors (each layer's start keys, ring and middle store) and a few counters (seen,
win_start, frame); with the model's rotation they determine every later forward, so restoring them bit for bit
gives bit-identical logits. The counters and an *identity* (the LM-Infinite settings that shape attention, the
model's layer count, KV heads, head_dim and dtype) travel as JSON in the file's metadata: a cache is refused by a
model it was not built for (CacheMismatch) rather than silently attended with other settings.

Saving is atomic: the file is written beside ``path``, synced, then renamed onto it, so a crash mid-save leaves
the previous file whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import safetensors
import torch

from .cache import InfiniteCache
from .layer import window_start
from .tensor_file import TensorFile, write_tensors
from .kv_bytes import KVShape
from .modes import outside_inference_mode
from .state import get_state

INFO_KEY = "lminfinite.cache"  # the metadata key holding the cache's info JSON; the caller's keys go beside it
FORMAT = "lminfinite.InfiniteCache"
VERSION = 1
IDENTITY_CONFIG = ("n_starting", "window", "topk_from_layer", "topk_distance")  # LMInfiniteConfig fields
_LAYER_TENSORS = ("start_k", "start_v", "ring_k", "ring_v")


class CacheMismatch(ValueError):
    """The model differs from the one the cache was built for: it would attend over the cache differently."""


class CacheFileError(ValueError):
    """The file or state is not a complete cache of this format: truncated, corrupt, or from another version."""


# -- state: tensors and counters ----------------------------------------------------------------------------
def cache_state(
    cache: InfiniteCache, *, middle_dtype: torch.dtype | None = None, copy: bool = True
) -> tuple[dict[str, torch.Tensor], dict]:
    """Every tensor and counter that rebuilds ``cache`` exactly; ``info`` is JSON-ready.

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
    layers = [_layer_state(layer, f"layers.{i}.", dtype, middle_dtype, tensors, take)
              for i, layer in enumerate(cache.layers)]
    identity = {name: getattr(cache.config, name) for name in IDENTITY_CONFIG}
    identity.update(num_layers=len(cache.layers), num_kv_heads=kv_heads, head_dim=head_dim, dtype=_dtype_name(dtype))
    info = {
        "format": FORMAT, "version": VERSION, "identity": identity,
        "topk": cache.topk, "model_topk": cache.config.topk,  # topk None: the cache follows the model's k
        "keep_middle": cache.keeps_middle,
        "offload_middle": any(layer.middle is not None and layer.middle.device is not None for layer in cache.layers),
        "batch_size": batch, "middle_dtype": _dtype_name(middle_dtype), "layers": layers,
    }
    return tensors, info


def _layer_state(layer, prefix: str, dtype, middle_dtype, tensors: dict, take) -> dict:
    """One layer's counters; its tensors go into ``tensors`` (the middle store: only the rows in use)."""
    middle = None if layer.middle is None else layer.middle.length
    if layer.is_initialized:
        for name in _LAYER_TENSORS:
            tensors[prefix + name] = take(getattr(layer, name), dtype)
    if middle:
        keys, values = layer.middle.view()
        tensors[prefix + "middle_k"], tensors[prefix + "middle_v"] = (
            take(keys, middle_dtype), take(values, middle_dtype)
        )
    return {"initialized": bool(layer.is_initialized), "seen": layer.seen, "win_start": layer.win_start,
            "frame": layer.frame, "middle": middle}


def restore_cache(model, tensors: dict[str, torch.Tensor], info: dict, *, device=None) -> InfiniteCache:
    """A new InfiniteCache of ``model`` holding exactly what ``cache_state`` recorded; rings on ``device``
    (default: the model's), the middle store on the CPU where the saved cache offloaded it."""
    state = get_state(model)
    if state is None:
        raise ValueError("restore_cache needs an LM-Infinite model: call lminfinite.enable(model) first")
    _check_info(info)
    _check_identity(model, state, info)
    _check_tensor_names(tensors, info)
    device = torch.device(device) if device is not None else _model_device(model)
    cache = InfiniteCache(
        model, keep_middle=info["keep_middle"], offload_middle=info["offload_middle"], topk=info["topk"]
    )
    with outside_inference_mode():  # the cache is written in place later, whatever mode this runs in
        for i, (layer, saved) in enumerate(zip(cache.layers, info["layers"])):
            _restore_layer(layer, i, saved, tensors, info, device)
    return cache


def _restore_layer(layer, i: int, saved: dict, tensors, info: dict, device: torch.device) -> None:
    if (layer.middle is None) != (saved["middle"] is None):
        raise CacheFileError(
            f"layer {i}: middle store {saved['middle']!r} contradicts keep_middle={info['keep_middle']} "
            f"and topk_from_layer={info['identity']['topk_from_layer']}"
        )
    layer.seen, layer.win_start, layer.frame = saved["seen"], saved["win_start"], saved["frame"]
    if not saved["initialized"]:
        return
    identity = info["identity"]
    dtype = getattr(torch, identity["dtype"])
    n_starting, window = identity["n_starting"], identity["window"]
    start, ring = min(saved["seen"], n_starting), n_starting + window
    rows = {"start_k": start, "start_v": start, "ring_k": ring, "ring_v": ring}
    for name in _LAYER_TENSORS:
        tensor = _checked(tensors, f"layers.{i}.{name}", info, rows[name], dtype)
        setattr(layer, name, tensor.to(device, dtype, copy=True))
    layer.dtype, layer.device, layer.is_initialized = dtype, device, True
    if saved["middle"]:
        middle_dtype = getattr(torch, info["middle_dtype"])
        keys = _checked(tensors, f"layers.{i}.middle_k", info, saved["middle"], middle_dtype)
        values = _checked(tensors, f"layers.{i}.middle_v", info, saved["middle"], middle_dtype)
        layer.middle.restore(keys, values, device, dtype)  # placed as its appends would be, one copy each


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


# -- checks: malformed input is a CacheFileError, another model a CacheMismatch -------------------------------
_INFO_FIELDS = {"identity": dict, "topk": (int, type(None)), "model_topk": int, "keep_middle": bool,
                "offload_middle": bool, "batch_size": (int, type(None)), "middle_dtype": (str, type(None)),
                "layers": list}
_IDENTITY_FIELDS = {"n_starting": int, "window": int, "topk_from_layer": int, "topk_distance": int,
                    "num_layers": int, "num_kv_heads": (int, type(None)), "head_dim": (int, type(None)),
                    "dtype": (str, type(None))}
_LAYER_FIELDS = {"initialized": bool, "seen": int, "win_start": int, "frame": int, "middle": (int, type(None))}


def _check_info(info) -> None:
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise CacheFileError(f"not an LM-Infinite cache: format {_get(info, 'format')!r}, expected {FORMAT!r}")
    if info.get("version") != VERSION:
        raise CacheFileError(f"unsupported cache format version {info.get('version')!r} (this library reads {VERSION})")
    _check_fields(info, _INFO_FIELDS, "cache info")
    identity = info["identity"]
    _check_fields(identity, _IDENTITY_FIELDS, "identity")
    for where, name in (("dtype", identity["dtype"]), ("middle_dtype", info["middle_dtype"])):
        if name is not None and not isinstance(getattr(torch, name, None), torch.dtype):
            raise CacheFileError(f"{where} {name!r} is not a torch dtype")
    if len(info["layers"]) != identity["num_layers"]:
        raise CacheFileError(f"{len(info['layers'])} layer records for num_layers={identity['num_layers']}")
    for i, layer in enumerate(info["layers"]):
        _check_fields(layer, _LAYER_FIELDS, f"layer {i}")
        if not layer["frame"] <= layer["win_start"] <= layer["seen"]:
            raise CacheFileError(f"layer {i}: counters out of order (frame <= win_start <= seen): {layer}")
        if layer["initialized"] and (identity["dtype"] is None or info["middle_dtype"] is None):
            raise CacheFileError(f"layer {i} holds tensors but the cache info records no dtype")
    _check_layers_agree(info["layers"], identity)


_SHARED_COUNTERS = ("initialized", "seen", "win_start", "frame")  # every layer sees every token: equal in all


def _check_layers_agree(layers: list, identity: dict) -> None:
    """The counters one cache's layers share, and what they imply: each is valid alone, but layers that
    disagree (or a middle store of another length) would be restored as a cache that answers differently."""
    for name in _SHARED_COUNTERS:
        values = [layer[name] for layer in layers]
        if len(set(values)) > 1:
            raise CacheFileError(f"the layers disagree on {name!r}: {_per_layer(values)}")
    if not layers:
        return
    n_starting, window, seen = identity["n_starting"], identity["window"], layers[0]["seen"]
    win_start = window_start(seen, n_starting, window)
    if layers[0]["win_start"] != win_start:
        raise CacheFileError(f"win_start {layers[0]['win_start']} does not follow from seen={seen}, "
                             f"n_starting={n_starting} and window={window} (expected {win_start})")
    middle = max(0, win_start - n_starting)  # every token evicted from the window, past the start
    for i, layer in enumerate(layers):
        if layer["middle"] not in (None, middle):
            raise CacheFileError(f"layer {i}: a middle store of {layer['middle']} tokens, expected {middle} "
                                 f"(seen={seen}, n_starting={n_starting}, window={window})")


def _per_layer(values: list) -> str:
    """'[3829, 3829, 300, 3829]', shortened for a model of many layers."""
    return str(values) if len(values) <= 8 else f"{values[:8]}... ({len(values)} layers)"


def _check_fields(record, fields: dict, where: str) -> None:
    """Each field present, of its JSON type (a bool is no int here), and no int negative."""
    if not isinstance(record, dict):
        raise CacheFileError(f"{where}: expected an object, got {type(record).__name__}")
    for name, types in fields.items():
        if name not in record:
            raise CacheFileError(f"{where}: missing field {name!r}")
        value = record[name]
        wrong_type = not isinstance(value, types) or (isinstance(value, bool) and types is not bool)
        if wrong_type or (isinstance(value, int) and value < 0):
            raise CacheFileError(f"{where}: field {name!r} has an invalid value {value!r}")


def _check_identity(model, state, info: dict) -> None:
    """Refuse a model whose attention over this cache would differ from the saving model's."""
    identity = info["identity"]
    current = {name: getattr(state.config, name) for name in IDENTITY_CONFIG}
    current["num_layers"] = state.num_layers
    if identity["dtype"] is not None:  # shapes and dtype are known once a layer holds tensors
        shape = KVShape.from_config(model.config)
        current.update(num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim, dtype=_dtype_name(_model_dtype(model)))
    if info["topk"] is None:  # the cache recalls with the model's k
        identity, current = {**identity, "topk": info["model_topk"]}, {**current, "topk": state.config.topk}
    for name, value in current.items():
        if identity[name] != value:
            raise CacheMismatch(
                f"the cache was saved for {name}={identity[name]!r}, this model has {name}={value!r}: "
                "restore it into the model (and LM-Infinite config) it was built with"
            )


def _check_tensor_names(tensors, info: dict) -> None:
    expected = set()
    for i, layer in enumerate(info["layers"]):
        if layer["initialized"]:
            expected.update(f"layers.{i}.{name}" for name in _LAYER_TENSORS)
        if layer["middle"]:
            expected.update((f"layers.{i}.middle_k", f"layers.{i}.middle_v"))
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CacheFileError(f"missing tensor {missing[0]}{more}")
    if unexpected:
        raise CacheFileError(f"unexpected tensor {unexpected[0]}: the cache info does not account for it")


def _checked(tensors, name: str, info: dict, rows: int, dtype: torch.dtype) -> torch.Tensor:
    tensor = tensors[name]
    identity = info["identity"]
    shape = (info["batch_size"], identity["num_kv_heads"], rows, identity["head_dim"])
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


def _get(record, key):
    return record.get(key) if isinstance(record, dict) else None


def _model_device(model) -> torch.device:
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else next(model.parameters()).device


def _model_dtype(model) -> torch.dtype:
    dtype = getattr(model, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else next(model.parameters()).dtype
