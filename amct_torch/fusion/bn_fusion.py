"""BN fusion on the torch.fx graph of a Caffe net (docs/fusion.md).

Patterns, matched on ``call_module`` nodes by Caffe type:
  output side  Convolution | Deconvolution | InnerProduct -> BatchNorm -> Scale
  input side   BatchNorm -> Scale -> Convolution (pad 0, group 1 only)
Output-side matches are folded first; a BN+Scale left over may then fold into the convolution
after it. The kept layer keeps its name; its module remembers what it absorbed in
``fused_layers`` and the graph keeps the whole map in ``gm.meta["fused_layers"]`` so the
exporters can write the quant info JSON.
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Optional, TypeVar

import torch
from torch import fx, nn

from amct_torch.arguments import bool_arg, checked, graph_module, opt, path_arg
from amct_torch.caffe.graph import set_inplace
from amct_torch.caffe.layers import BatchNormLayer, CaffeLayer, ScaleLayer
from amct_torch.caffe.layers.base import node_layer
from amct_torch.caffe.layers.traits import folds_bn_after, folds_scale_before, is_transposed, weight_param
from amct_torch.fusion import eligibility as rules
from amct_torch.fusion.fold import all_finite, bn_scale_affine, fold_input_side, fold_output_side

log = logging.getLogger(__name__)

_L = TypeVar("_L", bound=CaffeLayer)

@dataclass
class FusionResult:
    """``graph``: a new graph (the input is never changed). ``fused``: kept layer name ->
    absorbed layer names in the order absorbed. ``refused``: layer name -> why a matched pattern
    was not folded (a layer folded on one side may still be listed for the other side)."""

    graph: fx.GraphModule
    fused: dict[str, list[str]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def _typed(gm: fx.GraphModule, node: object, cls: type[_L]) -> Optional[tuple[fx.Node, _L]]:
    """(``node``, its layer) when ``node`` is a graph node calling a ``cls`` layer."""
    mod = node_layer(gm, node) if isinstance(node, fx.Node) else None
    return (node, mod) if isinstance(node, fx.Node) and isinstance(mod, cls) else None


def _user(gm: fx.GraphModule, node: fx.Node, cls: type[_L]) -> Optional[tuple[fx.Node, _L]]:
    """The first user of ``node`` that is a ``cls`` layer reading it as its first input."""
    for u in node.users:
        found = _typed(gm, u, cls)
        if found is not None and u.args[0] is node:
            return found
    return None


def _input(gm: fx.GraphModule, node: fx.Node, cls: type[_L]) -> Optional[tuple[fx.Node, _L]]:
    """``node``'s first input when it is a ``cls`` layer, with that layer."""
    return _typed(gm, node.args[0], cls) if node.args else None


def _set_weights(layer: CaffeLayer, weight: torch.Tensor, bias: torch.Tensor) -> None:
    """Replace the layer's weight and bias; a layer without bias gains one (``bias_term``)."""
    old = layer.weight
    layer.weight = nn.Parameter(weight.to(old.device), requires_grad=old.requires_grad)
    if layer.bias is None:
        if "bias" in layer.__dict__:
            del layer.__dict__["bias"]
        layer.bias = nn.Parameter(bias.to(old.device), requires_grad=old.requires_grad)
        getattr(layer.layer_param, str(weight_param(layer))).bias_term = True
    else:
        layer.bias = nn.Parameter(bias.to(layer.bias.device), requires_grad=layer.bias.requires_grad)


def _remember(layer: CaffeLayer, absorbed: list[str], fused: dict[str, list[str]]) -> None:
    prev = list(getattr(layer, "fused_layers", []))
    layer.fused_layers = prev + absorbed
    fused.setdefault(layer.caffe_name, []).extend(absorbed)


def _remove(gm: fx.GraphModule, nodes: Iterable[fx.Node], removed: set[fx.Node]) -> None:
    for node in nodes:
        removed.add(node)
        target = str(node.target)
        gm.graph.erase_node(node)
        gm.delete_submodule(target)


class _Fuser:
    def __init__(self, gm: fx.GraphModule, do_fusion: bool, skip: set[str], record_skip: set[str],
                 file: Optional[str]) -> None:
        self.gm = gm
        self.do_fusion = do_fusion
        self.skip = skip
        self.record_skip = record_skip
        self.file = file
        self.fused: dict[str, list[str]] = {}
        self.refused: dict[str, str] = {}
        self.removed: set[fx.Node] = set()  # erased while walking a snapshot of the node list

    def _refuse(self, name: str, reason: str, warn: bool = False) -> None:
        where = f"{self.file}: " if self.file else ""
        (log.warning if warn else log.info)("%slayer '%s': BN fusion skipped: %s", where, name, reason)
        self.refused[name] = reason if name not in self.refused else f"{self.refused[name]}; {reason}"

    def _common(self, layer: CaffeLayer, bn: BatchNormLayer, scale: ScaleLayer) -> Optional[str]:
        channels = bn.mean.numel()
        return (rules.switch_reason(self.do_fusion)
                or rules.skip_reason((layer.caffe_name, bn.caffe_name, scale.caffe_name), self.skip,
                                     self.record_skip)
                or rules.batchnorm_reason(bn)
                or rules.scale_reason(scale, channels))

    def _fold(self, layer: CaffeLayer, bn: BatchNormLayer, scale: ScaleLayer, reason: Optional[str],
              fold: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Fold ``bn`` and ``scale`` into ``layer``'s weights with ``fold(weight, bias, a, c)``
        (the side's formula), or refuse: the pattern's ``reason`` (logged), or non-finite
        folded values (a warning). True when the new weights are set (the caller then rewires
        the graph; the same steps on both sides, so one place)."""
        if reason:
            self._refuse(layer.caffe_name, reason)
            return False
        a, c = bn_scale_affine(bn.mean, bn.var, bn.eps, scale.weight, scale.bias)
        w, b = fold(layer.weight.detach(), None if layer.bias is None else layer.bias.detach(), a, c)
        if not all_finite(w, b):
            self._refuse(layer.caffe_name, f"folding '{bn.caffe_name}'/'{scale.caffe_name}' gives "
                         "non-finite values", warn=True)
            return False
        _set_weights(layer, w, b)
        return True

    def _absorbed(self, layer: CaffeLayer, bn: tuple[fx.Node, BatchNormLayer],
                  scale: tuple[fx.Node, ScaleLayer]) -> None:
        """The BN and Scale nodes (folded into ``layer``, already rewired) leave the graph and
        are remembered as ``layer``'s."""
        _remove(self.gm, (scale[0], bn[0]), self.removed)
        _remember(layer, [bn[1].caffe_name, scale[1].caffe_name], self.fused)

    def output_side(self) -> None:
        gm = self.gm
        for node in list(gm.graph.nodes):
            if node in self.removed:
                continue
            layer = node_layer(gm, node)
            if layer is None or not folds_bn_after(layer):
                continue
            found_bn = _user(gm, node, BatchNormLayer)
            found_sc = None if found_bn is None else _user(gm, found_bn[0], ScaleLayer)
            if found_bn is None or found_sc is None:
                continue
            (bn_node, bn), (sc_node, scale) = found_bn, found_sc
            reason = (self._common(layer, bn, scale)
                      or rules.single_consumer_reason(node, layer.caffe_name)
                      or rules.single_consumer_reason(bn_node, bn.caffe_name)
                      or rules.output_layer_reason(layer, bn.mean.numel()))
            fold = partial(fold_output_side, transposed=is_transposed(layer),
                           groups=getattr(layer, "groups", 1))
            if not self._fold(layer, bn, scale, reason, fold):
                continue
            del layer.layer_param.top[:]
            layer.layer_param.top.extend(scale.layer_param.top)
            sc_node.replace_all_uses_with(node)
            self._absorbed(layer, found_bn, found_sc)

    def input_side(self) -> None:
        gm = self.gm
        for node in list(gm.graph.nodes):
            conv = None if node in self.removed or not node.args else node_layer(gm, node)
            if conv is None or not folds_scale_before(conv):
                continue
            found_sc = _input(gm, node, ScaleLayer)
            found_bn = None if found_sc is None else _input(gm, found_sc[0], BatchNormLayer)
            if found_sc is None or found_bn is None:
                continue
            (sc_node, scale), (bn_node, bn) = found_sc, found_bn
            reason = (self._common(conv, bn, scale)
                      or rules.single_consumer_reason(bn_node, bn.caffe_name)
                      or rules.single_consumer_reason(sc_node, scale.caffe_name)
                      or rules.input_side_reason(conv, bn.mean.numel()))
            if not self._fold(conv, bn, scale, reason, fold_input_side):
                continue
            del conv.layer_param.bottom[:]
            conv.layer_param.bottom.extend(bn.layer_param.bottom)
            node.replace_input_with(sc_node, bn_node.args[0])
            self._absorbed(conv, found_bn, found_sc)


def _shared_weights(gm: fx.GraphModule) -> dict:
    """A ``deepcopy`` memo giving the copy new ``weight`` Parameters over the same storage.
    Why: fusion installs new tensors for the weights it folds and nothing writes a weight in
    place, so the layers it leaves alone (every layer of a net without BN, e.g. a 553 MB
    VGG-16) need no second copy. Biases are copied: improvements add to them in place."""
    memo: dict = {}
    for mod in gm.modules():
        w = mod._parameters.get("weight")
        if isinstance(w, nn.Parameter) and id(w) not in memo:
            memo[id(w)] = nn.Parameter(w.data, requires_grad=w.requires_grad)
    return memo


@checked(gm=graph_module, do_fusion=bool_arg, file=opt(path_arg))
def fuse_bn(gm: fx.GraphModule, *, do_fusion: bool = True, skip_fusion_layers: Iterable[str] = (),
            record_skip_fusion: Iterable[str] = (), file: Optional[str] = None) -> FusionResult:
    """Fold BatchNorm+Scale into neighbouring Convolution/Deconvolution/InnerProduct layers.

    ``skip_fusion_layers`` (quant config) and ``record_skip_fusion`` (layers whose record entry
    says ``skip_fusion: true``) name layers of a pattern — normally the kept layer — that must
    not be fused. ``file`` (the model file) only labels the log lines. Refusals are logged
    (non-finite results as warnings) and returned in ``FusionResult.refused``; nothing raises.
    The input graph is deep-copied and left untouched; the copy's ``weight`` Parameters share
    their storage with the input's (``_shared_weights``)."""
    out = copy.deepcopy(gm, _shared_weights(gm))
    fuser = _Fuser(out, bool(do_fusion), set(skip_fusion_layers), set(record_skip_fusion), file)
    with torch.no_grad():
        fuser.output_side()
        fuser.input_side()
    out.graph.lint()
    out.recompile()
    set_inplace(out, True)  # the buffer-reuse flags were computed for the unfused graph
    meta = getattr(out, "meta", None)
    if isinstance(meta, dict):
        merged = {k: list(v) for k, v in meta.get("fused_layers", {}).items()}
        for k, v in fuser.fused.items():
            merged.setdefault(k, []).extend(v)
        meta["fused_layers"] = merged
    return FusionResult(graph=out, fused=fuser.fused, refused=fuser.refused)


def fold_for_inference(gm: fx.GraphModule) -> fx.GraphModule:
    """A new graph with every eligible BN+Scale folded (``fuse_bn`` with its defaults)."""
    return fuse_bn(gm).graph
