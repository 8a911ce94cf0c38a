"""BN fusion (docs/fusion.md): fold BatchNorm+Scale into Convolution, Deconvolution and InnerProduct."""
from amct_torch.fusion.bn_fusion import FusionResult, fold_for_inference, fuse_bn

__all__ = ["FusionResult", "fuse_bn", "fold_for_inference"]
