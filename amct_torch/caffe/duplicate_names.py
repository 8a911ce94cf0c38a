"""Layers that share a name: accepted as Caffe accepts them, with distinct names inside the tool.

Why: Caffe does not require unique layer names (HED's five ``Crop`` layers are all "crop"); its
name index keeps the last, so trained weights go to the last layer of a name and the earlier
ones keep their fillers. Everything here is keyed by layer name (blobs, modules, the record),
so the earlier layers of a name are renamed ``name#1``, ``name#2`` … when read, the user's
name kept in the internal ``amct_caffe_name`` field; the writers put it back. A quantized layer
whose name is shared is refused: the record, keyed by name, could not say which layer an
entry belongs to once the models carry the user's names again.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Optional

from amct_torch.errors import ModelError

USER_NAME = "amct_caffe_name"

__all__ = ["rename_duplicates", "restore_user_name", "user_name", "refuse_quantized_duplicates"]


def rename_duplicates(layers: Iterable[Any]) -> None:
    """Give every layer but the last of each name a distinct name (``name#k``, k counting the
    earlier ones from 1, skipping names in use), keeping the user's in ``amct_caffe_name``."""
    layers = list(layers)
    last = {layer.name: i for i, layer in enumerate(layers)}
    if len(last) == len(layers):
        return
    taken = {layer.name for layer in layers}
    seen: Counter = Counter()
    for i, layer in enumerate(layers):
        if last[layer.name] == i:
            continue
        seen[layer.name] += 1
        k, new = seen[layer.name], f"{layer.name}#{seen[layer.name]}"
        while new in taken:
            k += 1
            new = f"{layer.name}#{k}"
        taken.add(new)
        setattr(layer, USER_NAME, layer.name)
        layer.name = new


def user_name(layer: Any) -> str:
    """The name the user gave ``layer`` (a LayerParameter)."""
    return getattr(layer, USER_NAME) if layer.HasField(USER_NAME) else layer.name


def restore_user_name(layer: Any) -> None:
    """Put the user's name back on ``layer`` and drop the internal field (before writing)."""
    if layer.HasField(USER_NAME):
        layer.name = getattr(layer, USER_NAME)
        layer.ClearField(USER_NAME)


def refuse_quantized_duplicates(layers: Iterable[Any], quantized: Iterable[str],
                                file: Optional[str]) -> None:
    """``ModelError`` when a layer in ``quantized`` (internal names) shares its user's name
    with another layer, naming the file and the layer."""
    layers = list(layers)
    counts = Counter(user_name(layer) for layer in layers)
    wanted = set(quantized)
    for layer in layers:
        name = user_name(layer)
        if layer.name in wanted and counts[name] > 1:
            raise ModelError(f"{counts[name]} layers are named '{name}' and this {layer.type} is "
                             f"quantized: the record is keyed by layer name and could not tell them "
                             f"apart; give the layers distinct names in the prototxt (Caffe gives the "
                             f"caffemodel's weights of a shared name to the last layer of that name)",
                             file=file, layer=name)
