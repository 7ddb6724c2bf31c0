"""The built-in models and the one way to build any model a config names (built-in or "package.module:factory")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence, Tuple

from torch import nn

from psframework.errors import ConfigError
from psframework.models.resnet import CifarResNet
from psframework.models.split import ConvSpec, SplitCNN


@dataclass(frozen=True)
class Family:
    """A built-in model and its defaults; `build(in_channels, classes, size, channels, fc, batch_norm, dropout)`."""

    build: Callable[..., nn.Module]
    input_size: int
    channels: Tuple[int, ...]
    fc: Tuple[int, ...]
    batch_norm: bool
    dropout: float


def chain(specs: Sequence[ConvSpec]) -> Callable[..., nn.Module]:
    """Return the builder of a conv-block chain with these layers (channels and BatchNorm configurable)."""
    def build(in_channels: int, classes: int, size: int, channels: Sequence[int], fc: Sequence[int],
              batch_norm: bool, dropout: float) -> nn.Module:
        if len(channels) != len(specs):
            raise ValueError(f"model.channels: got {len(channels)} values {list(channels)}, "
                             f"the model has {len(specs)} conv layers")
        layers = [replace(s, out_channels=c, batch_norm=batch_norm) for s, c in zip(specs, channels)]
        return SplitCNN(in_channels, size, layers, fc, classes, dropout)
    return build


def resnet(blocks: Sequence[int]) -> Callable[..., nn.Module]:
    """Return the builder of a CIFAR ResNet with this many basic blocks per stage."""
    def build(in_channels: int, classes: int, size: int, channels: Sequence[int], fc: Sequence[int],
              batch_norm: bool, dropout: float) -> nn.Module:
        return CifarResNet(in_channels, classes, channels, blocks, batch_norm, fc, dropout)
    return build


def _vgg16() -> Tuple[ConvSpec, ...]:
    """Return VGG-16's 13 conv layers (3x3, padding 1), max pooling after each of its five stages."""
    stages = [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]
    return tuple(ConvSpec(width, pool=2 if i == count - 1 else 0) for width, count in stages for i in range(count))


FAMILIES = {
    "lenet5": Family(chain([ConvSpec(6, 5, 1, 2, pool=2), ConvSpec(16, 5, 1, 0, pool=2)]), 28, (6, 16),
                     (120, 84), False, 0.0),
    "vgg-small": Family(chain([ConvSpec(32, pool=2), ConvSpec(64, pool=2), ConvSpec(128), ConvSpec(128, pool=2)]),
                        32, (32, 64, 128, 128), (1024, 1024), False, 0.0),
    "alexnet-small": Family(chain([ConvSpec(32, 5, 1, 2, pool=2), ConvSpec(64, 5, 1, 2, pool=2), ConvSpec(96),
                                   ConvSpec(64), ConvSpec(64, pool=2)]), 32, (32, 64, 96, 64, 64), (512, 256),
                            False, 0.5),
    "vgg16": Family(chain(_vgg16()), 32, tuple(s.out_channels for s in _vgg16()), (), True, 0.0),
    "resnet20": Family(resnet((3, 3, 3)), 32, (16, 32, 64), (), True, 0.0),
    "resnet18": Family(resnet((2, 2, 2, 2)), 32, (64, 128, 256, 512), (), True, 0.0),
}
BUILT_IN_OPTIONS = ("channels", "fc", "batch_norm", "dropout")
GIVEN_PREFIX = "python:"  # model.name of a module handed to psframework.train_module
_GIVEN: dict = {}


def give(model: nn.Module) -> str:
    """Make a module built in Python the one a config can name; return that name."""
    name = f"{GIVEN_PREFIX}{type(model).__qualname__}"
    _GIVEN[name] = model
    return name


def model_defaults(name: str) -> dict:
    """Return a built-in model's default input size, channels, fc widths, BatchNorm and dropout."""
    family = _family(name)
    return {"input_size": family.input_size, "channels": list(family.channels), "fc": list(family.fc),
            "batch_norm": family.batch_norm, "dropout": family.dropout}


def _family(name: str) -> Family:
    if name not in FAMILIES:
        import difflib

        hint = difflib.get_close_matches(name, list(FAMILIES), n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"model.name: got {name!r}, expected one of {', '.join(FAMILIES)} "
                          f"or package.module:factory{extra}")
    return FAMILIES[name]


# A factory with **kwargs gets num_classes through them, as torchvision's models take it; never in_channels,
# which those models do not take (they pass **kwargs on to a constructor that raises TypeError).
VIA_KWARGS = ("num_classes",)


def check_in_channels(model: nn.Module, in_channels: int, name: str) -> None:
    """Refuse a model whose first nn.Conv2d (in modules() order) does not take the data's channels."""
    first = next(((layer, m) for layer, m in model.named_modules() if isinstance(m, nn.Conv2d)), None)
    if first is None or _uninitialized(first[1]) or first[1].in_channels == in_channels:
        return
    layer, takes = first[0], first[1].in_channels
    channels = f"{in_channels} channel{'' if in_channels == 1 else 's'}"
    raise ConfigError(f"model.name: model {name} takes {takes}-channel images (its first convolution {layer} has "
                      f"in_channels={takes}) but the data have {channels}; expected a data.dataset of {takes}-channel "
                      f"images (image-folder gives 3) or a model built for {channels} (its own argument in model.args)")


def _uninitialized(module: nn.Module) -> bool:
    """Return whether a lazy module has not yet learned its input shape (its in_channels is not known)."""
    return isinstance(module, nn.modules.lazy.LazyModuleMixin) and module.has_uninitialized_params()


def input_size_of(model_cfg) -> Optional[int]:
    """Return the image size the model is given: model.input_size, a built-in's default, or None (as stored)."""
    from psframework.imports import is_import_path

    if model_cfg.input_size is not None or is_import_path(model_cfg.name):
        return model_cfg.input_size
    return _family(model_cfg.name).input_size


def build_model(model_cfg, in_channels: int, classes: int) -> nn.Module:
    """Build the configured model (built-in or from its factory); every rank builds the same one per seed."""
    from psframework.imports import call_factory, is_import_path, load_factory

    if model_cfg.name.startswith(GIVEN_PREFIX):
        if model_cfg.name not in _GIVEN:
            raise ConfigError(f"model.name: {model_cfg.name!r} names a module given to psframework.train_module, "
                              "and none was given in this process")
        check_in_channels(_GIVEN[model_cfg.name], in_channels, model_cfg.name)
        return _GIVEN[model_cfg.name]
    if is_import_path(model_cfg.name):
        given = [f"model.{key}" for key in BUILT_IN_OPTIONS if getattr(model_cfg, key) is not None]
        if given:
            raise ConfigError(f"{given[0]}: applies to built-in models only; give a factory its own arguments "
                              f"in model.args (model.name is {model_cfg.name!r})")
        factory = load_factory(model_cfg.name, "model.name")
        offered = {"in_channels": in_channels, "num_classes": classes}
        model = call_factory(factory, model_cfg.args, "model.name", offered=offered, via_kwargs=VIA_KWARGS)
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model.name: factory {model_cfg.name!r} returned a {type(model).__name__}, "
                              "expected a torch.nn.Module")
        check_in_channels(model, in_channels, model_cfg.name)
        return model
    if model_cfg.args:
        raise ConfigError(f"model.args: got {model_cfg.args!r}; built-in model {model_cfg.name} takes its options "
                          f"as model.{', model.'.join(BUILT_IN_OPTIONS)}")
    family, d = _family(model_cfg.name), model_defaults(model_cfg.name)
    pick = {key: d[key] if getattr(model_cfg, key) is None else getattr(model_cfg, key) for key in BUILT_IN_OPTIONS}
    try:
        return family.build(in_channels, classes, input_size_of(model_cfg), pick["channels"], pick["fc"],
                            pick["batch_norm"], pick["dropout"])
    except ValueError as exc:
        raise ConfigError(f"model {model_cfg.name}: {exc}" if not str(exc).startswith("model.") else str(exc)) \
            from None
