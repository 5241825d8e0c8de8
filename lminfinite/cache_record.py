"""The record of a saved cache (the JSON beside its tensors, persist.py), as dataclasses.

``to_dict`` gives what the file holds and ``CacheInfo.from_dict`` reads it back, but only a record that is
whole, well typed and self-consistent: anything else is a CacheFileError that says what is wrong, before a
single tensor is read. The dicts are the file's format (VERSION 1): their keys are these classes' fields, in
this order.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import asdict, dataclass, fields, is_dataclass

import torch

from .layer import window_start
from .layer_state import POSITIONS, LayerCounters

FORMAT = "lminfinite.InfiniteCache"
VERSION = 1


class CacheMismatch(ValueError):
    """The model differs from the one the cache was built for: it would attend over the cache differently."""


class CacheFileError(ValueError):
    """The file or state is not a complete cache of this format: truncated, corrupt, or from another version."""


@dataclass(frozen=True)
class CacheIdentity:
    """What attention over the cache depends on besides its tensors: a model must match it to restore the cache.
    The first four are LMInfiniteConfig fields (CONFIG_FIELDS); shapes and dtype are None while no layer holds
    tensors."""

    n_starting: int
    window: int
    topk_from_layer: int
    topk_distance: int
    num_layers: int
    num_kv_heads: int | None
    head_dim: int | None
    dtype: str | None


CONFIG_FIELDS = ("n_starting", "window", "topk_from_layer", "topk_distance")  # CacheIdentity's LMInfiniteConfig fields


@dataclass(frozen=True)
class CacheInfo:
    """Everything but the tensors: the identity, how the cache recalls (``topk`` None: with the model's k,
    ``model_topk``) and keeps its middle tokens, the tensors' batch size and middle dtype, and each layer's
    counters."""

    identity: CacheIdentity
    topk: int | None
    model_topk: int
    keep_middle: bool
    offload_middle: bool
    batch_size: int | None
    middle_dtype: str | None
    layers: tuple[LayerCounters, ...]

    def to_dict(self) -> dict:
        """JSON-ready: what the file holds."""
        return {"format": FORMAT, "version": VERSION, **asdict(self), "layers": [l.to_dict() for l in self.layers]}

    @classmethod
    def from_dict(cls, info) -> CacheInfo:
        """The record ``info`` holds; a CacheFileError if it is not a whole, consistent record of this format."""
        if not isinstance(info, dict) or info.get("format") != FORMAT:
            raise CacheFileError(f"not an LM-Infinite cache: format {_get(info, 'format')!r}, expected {FORMAT!r}")
        if info.get("version") != VERSION:
            raise CacheFileError(f"unsupported cache format version {info.get('version')!r} "
                                 f"(this library reads {VERSION})")
        _check_fields(info, cls, "cache info")
        _check_fields(info["identity"], CacheIdentity, "identity")
        identity = _build(CacheIdentity, info["identity"])
        for where, name in (("dtype", identity.dtype), ("middle_dtype", info["middle_dtype"])):
            if name is not None and not isinstance(getattr(torch, name, None), torch.dtype):
                raise CacheFileError(f"{where} {name!r} is not a torch dtype")
        if len(info["layers"]) != identity.num_layers:
            raise CacheFileError(f"{len(info['layers'])} layer records for num_layers={identity.num_layers}")
        holds_dtypes = identity.dtype is not None and info["middle_dtype"] is not None
        layers = tuple(_layer_counters(i, layer, holds_dtypes) for i, layer in enumerate(info["layers"]))
        _check_layers_agree(layers, identity)
        return _build(cls, {**info, "identity": identity, "layers": layers})


def _layer_counters(i: int, record, holds_dtypes: bool) -> LayerCounters:
    """Layer ``i``'s counters, each valid alone."""
    _check_fields(record, LayerCounters, f"layer {i}")
    if not record["frame"] <= record["win_start"] <= record["seen"]:
        raise CacheFileError(f"layer {i}: counters out of order (frame <= win_start <= seen): {record}")
    if record["initialized"] and not holds_dtypes:
        raise CacheFileError(f"layer {i} holds tensors but the cache info records no dtype")
    return _build(LayerCounters, record)


_SHARED_COUNTERS = ("initialized", *POSITIONS)  # every layer sees every token: equal in all


def _check_layers_agree(layers: tuple[LayerCounters, ...], identity: CacheIdentity) -> None:
    """The counters one cache's layers share, and what they imply: each is valid alone, but layers that
    disagree (or a middle store of another length) would be restored as a cache that answers differently."""
    for name in _SHARED_COUNTERS:
        values = [getattr(layer, name) for layer in layers]
        if len(set(values)) > 1:
            raise CacheFileError(f"the layers disagree on {name!r}: {_per_layer(values)}")
    if not layers:
        return
    n_starting, window, seen = identity.n_starting, identity.window, layers[0].seen
    win_start = window_start(seen, n_starting, window)
    if layers[0].win_start != win_start:
        raise CacheFileError(f"win_start {layers[0].win_start} does not follow from seen={seen}, "
                             f"n_starting={n_starting} and window={window} (expected {win_start})")
    middle = max(0, win_start - n_starting)  # every token evicted from the window, past the start
    for i, layer in enumerate(layers):
        if layer.middle not in (None, middle):
            raise CacheFileError(f"layer {i}: a middle store of {layer.middle} tokens, expected {middle} "
                                 f"(seen={seen}, n_starting={n_starting}, window={window})")


def _per_layer(values: list) -> str:
    """'[3829, 3829, 300, 3829]', shortened for a model of many layers."""
    return str(values) if len(values) <= 8 else f"{values[:8]}... ({len(values)} layers)"


def _check_fields(record, schema: type, where: str) -> None:
    """Each field of ``schema`` present, of its JSON type (a bool is no int here), and no int negative."""
    if not isinstance(record, dict):
        raise CacheFileError(f"{where}: expected an object, got {type(record).__name__}")
    for name, types in _json_types(schema).items():
        if name not in record:
            raise CacheFileError(f"{where}: missing field {name!r}")
        value = record[name]
        wrong_type = not isinstance(value, types) or (isinstance(value, bool) and types is not bool)
        if wrong_type or (isinstance(value, int) and value < 0):
            raise CacheFileError(f"{where}: field {name!r} has an invalid value {value!r}")


@functools.cache
def _json_types(schema: type) -> dict[str, object]:
    """Each field's type as JSON holds it: a nested record is an object, a tuple of them an array."""
    hints = typing.get_type_hints(schema)
    return {field.name: _json_type(hints[field.name]) for field in fields(schema)}


def _json_type(hint) -> object:
    if is_dataclass(hint):
        return dict
    return list if typing.get_origin(hint) is tuple else hint


def _build(schema: type, record: dict):
    """``schema`` from a checked record's fields (a record may hold more keys: ``format`` and ``version``)."""
    return schema(**{field.name: record[field.name] for field in fields(schema)})


def _get(record, key):
    return record.get(key) if isinstance(record, dict) else None
