"""CNNs as a splittable conv stack plus an FC head."""

from psframework.models.split import ConvBlock, ConvSpec, SplitCNN, build_model, model_defaults, model_summary

__all__ = ["ConvBlock", "ConvSpec", "SplitCNN", "build_model", "model_defaults", "model_summary"]
