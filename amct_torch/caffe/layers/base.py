"""The common base of every Caffe layer module, and the registry from type string to class.

Each Caffe layer becomes exactly one ``CaffeLayer`` submodule of the graph so that later stages
(fusion, calibration hooks, export) can map every module back to the Caffe layer it came from
and write its parameters back in Caffe's own blob order and shapes (``caffe_blobs()``).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Callable, ClassVar, NoReturn, Optional

import numpy as np
import torch
from torch import nn

from amct_torch.caffe.quant_types import QUANT_TYPES, QuantType
from amct_torch.errors import ModelError

if TYPE_CHECKING:
    from torch import fx

Shape = tuple[int, ...]

_REGISTRY: dict[str, type[CaffeLayer]] = {}

#: set while ``load_caffe`` builds a graph from arrays it read itself and drops afterwards: the
#: layers then take those arrays as their weights instead of copying them
_TAKE_BLOBS: contextvars.ContextVar[bool] = contextvars.ContextVar("amct_take_blobs", default=False)


@contextlib.contextmanager
def taking_blobs() -> Iterator[None]:
    """Within the block, ``blob_as`` hands a writable contiguous float32 blob to torch as it is
    (no copy). Only for blobs nobody else holds (a 553 MB VGG-16 otherwise has two copies while
    it loads)."""
    token = _TAKE_BLOBS.set(True)
    try:
        yield
    finally:
        _TAKE_BLOBS.reset(token)


def register(*type_names: str) -> Callable[[type[CaffeLayer]], type[CaffeLayer]]:
    """Class decorator: make the class the module for the given Caffe layer type strings, with
    their quantization traits from ``caffe/quant_types.py`` (the same for each of its names)."""
    def deco(cls: type[CaffeLayer]) -> type[CaffeLayer]:
        quant = {QUANT_TYPES.get(t) for t in type_names}
        if len(quant) != 1:
            raise TypeError(f"{cls.__name__}: the types {type_names} are quantized differently")
        cls.quant_type = quant.pop()
        cls.quantizable_type = cls.quant_type is not None
        cls.weight_layout = None if cls.quant_type is None else cls.quant_type.weight_layout
        cls.weight_param = None if cls.quant_type is None else cls.quant_type.weight_param
        for t in type_names:
            _REGISTRY[t] = cls
        return cls
    return deco


def layer_class(type_name: str) -> Optional[type[CaffeLayer]]:
    """The module class for a Caffe type string, or None if the type is not supported."""
    return _REGISTRY.get(type_name)


def supported_types() -> list[str]:
    """Every Caffe layer type string the loader understands (sorted)."""
    return sorted(_REGISTRY)


class CaffeLayer(nn.Module):
    """One Caffe layer as a torch module with Caffe's exact test-phase semantics.

    ``blobs`` are the layer's parameter arrays from the caffemodel in Caffe's order (any shape
    with the right element count: legacy 4-D blobs are right-aligned, so they are reshaped by
    count), or None when the net is loaded without weights (then parameters are zeros and
    ``bottom_shapes`` must be known). ``bottom_shapes`` are the declared input shapes when they
    can be derived from the net's input declaration, else None.

    Subclasses implement ``setup`` (read params, check and keep blobs) and ``forward``.
    """

    bottoms: ClassVar[tuple[int, Optional[int]]] = (1, 1)  # (min, max) bottom count; None = any
    tops: ClassVar[tuple[int, Optional[int]]] = (1, 1)
    data_dependent: ClassVar[bool] = False  # output shape depends on values: no meta propagation
    same_shape: ClassVar[bool] = False  # element-wise: output shape = input shape (setup checks params)
    can_run_inplace: ClassVar[bool] = False  # may overwrite its first bottom when ``inplace`` is set
    fresh_output: ClassVar[bool] = False  # returns a new tensor (or an in-place one over a fresh one)
    # reading a blob does not stop it being a net output (Silence, metric and loss layers): the
    # net's outputs are the blobs no other layer reads
    keeps_outputs: ClassVar[bool] = False

    # -- the type's traits: the rest of the package asks them through ``caffe.layers.traits``
    #: how AMCT quantizes the type (``caffe/quant_types.py``, set by ``register``): None if never;
    #: ``quantizable_type``, ``weight_layout`` and ``weight_param`` are read from it
    quant_type: ClassVar[Optional[QuantType]] = None
    quantizable_type: ClassVar[bool] = False
    weight_layout: ClassVar[Optional[str]] = None
    weight_param: ClassVar[Optional[str]] = None
    #: a fork's depthwise convolution (quantized as Convolution; its record may be sized by its weights)
    depthwise: ClassVar[bool] = False
    #: computes every sample of a batch on its own (given an axis > 0 and no batch statistics)
    per_sample: ClassVar[bool] = False
    #: BN fusion: a BatchNorm + Scale after it folds into its weights / a Scale before it folds in
    fold_bn_after: ClassVar[bool] = False
    fold_scale_before: ClassVar[bool] = False
    #: the blobs Caffe fills when a caffemodel omits the layer: (param field, [(filler field,
    #: default when absent: None = refuse, an all-zero weight)] in blob order); None: none
    fillers: ClassVar[Optional[tuple[str, tuple[tuple[str, Optional[float]], ...]]]] = None
    #: why the type has no ONNX form (non-empty: the ONNX exporter refuses it with this reason);
    #: every other type registers its mapping in ``export/onnx`` for its class
    no_onnx_form: ClassVar[str] = ""
    #: a metric or loss layer (Accuracy, SoftmaxWithLoss...): not part of the inference graph;
    #: it runs after it, on the graph's outputs and the data layers' labels (caffe/head.py),
    #: and is never quantized nor exported to ONNX
    net_head: ClassVar[bool] = False
    # The parameters of the weighted layers (Convolution, Deconvolution, InnerProduct, Scale,
    # Bias, PReLU, Normalize...), declared here so that code reading them through a CaffeLayer
    # is type-checked; a layer without them simply does not set them (``getattr(m, "weight", None)``).
    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    #: set by BN fusion on a layer that absorbed others (their names); absent otherwise
    fused_layers: list[str]

    def __init__(self, layer_param, blobs: Optional[Sequence[np.ndarray]] = None,
                 bottom_shapes: Optional[Sequence[Shape]] = None, file: Optional[str] = None) -> None:
        super().__init__()
        lp = type(layer_param)()
        lp.CopyFrom(layer_param)
        lp.ClearField("blobs")
        self.caffe_name: str = lp.name
        self.caffe_type: str = lp.type
        self.layer_param = lp
        self._file = file
        self.num_tops = len(lp.top)
        # Set by the graph builder only when the first bottom is a fresh tensor no one else reads
        # (Caffe's own in-place semantics); saves a memory pass and an allocation per layer.
        self.inplace = False
        self._check_counts(len(lp.bottom), len(lp.top))
        self.setup(None if blobs is None else [np.asarray(b) for b in blobs],
                   None if bottom_shapes is None else [tuple(int(d) for d in s) for s in bottom_shapes])
        # Loaded models are for inference: no parameter records autograd history, so
        # running the model outside ``torch.no_grad`` neither builds a graph nor warns.
        self.requires_grad_(False)

    @classmethod
    def quantizable_param(cls, layer_param) -> bool:
        """Whether a layer of this type with these params (a ``LayerParameter`` or V1 layer)
        is quantized: the type's trait, narrowed by the params where the type says so."""
        return cls.quant_type is not None and cls.quant_type.takes(layer_param)

    # -- to override ---------------------------------------------------------------------
    def setup(self, blobs: Optional[list[np.ndarray]], bottom_shapes: Optional[list[Shape]]) -> None:
        """Read the layer's params and blobs. Default: a layer without parameters."""
        if blobs:
            self.fail(f"{self.caffe_type} takes no weights but the caffemodel has {len(blobs)} blob(s)")

    def caffe_blobs(self) -> list[np.ndarray]:
        """The layer's parameters as Caffe stores them: Caffe's blob order and shapes, float32."""
        return []

    def infer_shapes(self, bottom_shapes: list[Shape]) -> Optional[list[Shape]]:
        """Top shapes computed without running the layer, or None to let the builder run it on
        the meta device. Raises ModelError (``fail``) when the inputs do not fit the layer."""
        if self.same_shape and len(bottom_shapes) == 1:
            return [bottom_shapes[0]] * self.num_tops
        return None

    # -- helpers -------------------------------------------------------------------------
    def may_overwrite(self, x: torch.Tensor) -> bool:
        """True when this call may write its result into ``x`` (see ``inplace``); never while
        autograd records ``x``."""
        return self.inplace and not (x.requires_grad and torch.is_grad_enabled())

    def fail(self, message: str) -> NoReturn:
        """Raise the project's ModelError naming the file and this layer."""
        raise ModelError(message, file=self._file, layer=self.caffe_name)

    def _check_counts(self, nb: int, nt: int) -> None:
        for what, n, (lo, hi) in (("bottom", nb, self.bottoms), ("top", nt, self.tops)):
            if n < lo or (hi is not None and n > hi):
                want = str(lo) if hi == lo else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
                self.fail(f"{self.caffe_type} takes {want} {what}(s), got {n}")

    def expect_blob_count(self, blobs: Optional[list[np.ndarray]], lo: int, hi: int) -> None:
        """Fail unless the number of blobs is within [lo, hi] (skipped when loading without weights)."""
        if blobs is not None and not lo <= len(blobs) <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            self.fail(f"{self.caffe_type} expects {want} weight blob(s), the caffemodel has {len(blobs)}")

    def blob_as(self, blob: np.ndarray, shape: Shape, what: str, strict_4d: bool = False) -> torch.Tensor:
        """The blob as a float32 tensor of ``shape``; legacy right-aligned blobs are reshaped by
        element count. With ``strict_4d`` a 4-D blob must have exactly ``shape``."""
        arr = np.asarray(blob, dtype=np.float32)
        if strict_4d and arr.ndim == 4 and len(shape) == 4 and tuple(arr.shape) != tuple(shape):
            self.fail(f"{what} blob has shape {list(arr.shape)}, expected {list(shape)}")
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            self.fail(f"{what} blob has {arr.size} elements (shape {list(arr.shape)}), "
                      f"expected shape {list(shape)}")
        arr = arr.reshape(shape)
        if _TAKE_BLOBS.get() and arr.flags.writeable and arr.flags.c_contiguous:
            return torch.from_numpy(arr)  # the loader's own fresh array: no second copy
        return torch.from_numpy(arr.copy())

    def extra_repr(self) -> str:
        return f"name={self.caffe_name!r}"


def canonical_axis(axis: int, ndim: int, layer: CaffeLayer, what: str = "axis") -> int:
    """Caffe's CanonicalAxisIndex: negative counts from the end; out of range is an error."""
    if not -ndim <= axis < ndim:
        layer.fail(f"{what} {axis} out of range for a {ndim}-D input")
    return axis % ndim


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A parameter/buffer as a float32 numpy array on the host (a copy, or within
    ``borrowing_blobs`` a view where the tensor already is one)."""
    arr = t.detach().to("cpu", torch.float32).numpy()
    if not _BORROW_BLOBS.get():
        return arr.copy()
    arr.flags.writeable = False  # a borrowed view: never taken by ``taking_blobs``
    return arr


#: set while an exporter reads ``caffe_blobs()`` only to serialise them at once
_BORROW_BLOBS: contextvars.ContextVar[bool] = contextvars.ContextVar("amct_borrow_blobs", default=False)


@contextlib.contextmanager
def borrowing_blobs() -> Iterator[None]:
    """Within the block ``caffe_blobs()`` returns read-only views of the layers' CPU float32
    tensors instead of copies. Only for readers that neither keep nor modify them (the layer-by-layer
    writers: a quantized layer's weight blob is replaced at once, and copying fc6 of a VGG-16
    only to drop it cost 0.4 GB)."""
    token = _BORROW_BLOBS.set(True)
    try:
        yield
    finally:
        _BORROW_BLOBS.reset(token)


def node_layer(gm: torch.nn.Module, node: fx.Node) -> Optional[CaffeLayer]:
    """The CaffeLayer module a graph node calls; None for any other node."""
    if node.op != "call_module":
        return None
    mod = gm.get_submodule(str(node.target))
    return mod if isinstance(mod, CaffeLayer) else None


def layer_modules(gm: fx.GraphModule) -> dict[str, CaffeLayer]:
    """Caffe layer name -> its CaffeLayer module, in graph order (the graph's call_module
    nodes; here beside CaffeLayer so that the reader/writer can use it without the builder)."""
    out: dict[str, CaffeLayer] = {}
    for node in gm.graph.nodes:
        mod = node_layer(gm, node)
        if mod is not None:
            out.setdefault(mod.caffe_name, mod)
    return out
