"""Models: the built-in ones, any model from a factory, and where each of their parts runs."""

from psframework.models.placement import CodedConv, ConvGeometry, Placement, place, split_parameters, trace_run
from psframework.models.split import ConvBlock, ConvSpec, SplitCNN
from psframework.models.zoo import FAMILIES, build_model, input_size_of, model_defaults

__all__ = ["CodedConv", "ConvBlock", "ConvGeometry", "ConvSpec", "FAMILIES", "Placement", "SplitCNN", "build_model",
           "input_size_of", "model_defaults", "place", "split_parameters", "trace_run"]
