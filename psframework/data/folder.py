"""`data.dataset: image-folder`: ROOT/train/CLASS/IMAGE and ROOT/test/CLASS/IMAGE, decoded with Pillow and streamed.

Every image becomes RGB, is resized to model.input_size squared as torchvision's Resize((s, s)) does on a
PIL image (Pillow's bilinear resize), and scaled to [0, 1] float32 (C, H, W) as its ToTensor does. The
splits stream like a factory's Dataset (psframework.data.stream): nothing is cached on disk, and only the
listing of the files is kept in memory, once per process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from psframework.data.base import Dataset
from psframework.data.stream import StreamedSplit
from psframework.data.transforms import augmentation, normalize
from psframework.errors import ConfigError

NAME = "image-folder"
EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
LAYOUT = "ROOT/train/CLASS/IMAGE and ROOT/test/CLASS/IMAGE"
_IMAGES = ", ".join(EXTENSIONS)


@dataclass(frozen=True)
class Listing:
    """The class names (sorted train sub-folders) and each split's image paths and labels."""

    classes: Tuple[str, ...]
    train: Tuple[List[str], List[int]]
    test: Tuple[List[str], List[int]]


# One listing per root and process: the checks of a config and the loading of its data share it.
_LISTINGS: Dict[str, Listing] = {}


def _visible_folders(path: str) -> List[str]:
    """Return the sorted names of the sub-folders of `path`, hidden ones (.name) left out."""
    return sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))


def _split_folder(root: str, split: str) -> str:
    """Return ROOT/split, or raise the one-line error that says it is missing."""
    path = os.path.join(root, split)
    if not os.path.isdir(path):
        raise ConfigError(f"data.root: {root} has no {split} folder; expected the image-folder layout {LAYOUT}")
    return path


def class_names(root: str) -> List[str]:
    """Return the classes of an image folder: the sorted sub-folders of ROOT/train."""
    train = _split_folder(root, "train")
    names = _visible_folders(train)
    if not names:
        raise ConfigError(f"data.root: {train} has no class folder; expected one sub-folder of images per class "
                          f"({LAYOUT})")
    return names


def _images_of(folder: str) -> List[str]:
    """Return the image files under a class folder (sub-folders too), in torchvision's ImageFolder order."""
    walked = []
    for base, folders, names in os.walk(folder, followlinks=True):
        folders[:] = [name for name in folders if not name.startswith(".")]  # pruned before the walk enters them
        walked.append((base, sorted(n for n in names if n.lower().endswith(EXTENSIONS) and not n.startswith("."))))
    found = [os.path.join(base, name) for base, names in sorted(walked) for name in names]
    if not found:
        raise ConfigError(f"data.root: class folder {folder} has no image; expected {_IMAGES} files")
    return found


def _list_split(root: str, split: str, classes: List[str]) -> Tuple[List[str], List[int]]:
    """Return the image paths and labels of one split; a class the train split lacks is an error."""
    folder = _split_folder(root, split)
    paths: List[str] = []
    labels: List[int] = []
    for name in _visible_folders(folder):
        if name not in classes:
            raise ConfigError(f"data.root: {os.path.join(folder, name)} is a class that {root}/train does not "
                              f"have; expected test classes among the train classes ({', '.join(classes)})")
        images = _images_of(os.path.join(folder, name))
        paths += images
        labels += [classes.index(name)] * len(images)
    if not paths:
        raise ConfigError(f"data.root: {folder} has no class folder; expected one sub-folder of images per class "
                          f"({LAYOUT})")
    return paths, labels


def listing(root: str) -> Listing:
    """Return the listing of an image folder (read once per process), checking its layout."""
    key = os.path.abspath(root)
    if key not in _LISTINGS:
        classes = class_names(key)
        _LISTINGS[key] = Listing(tuple(classes), _list_split(key, "train", classes),
                                 _list_split(key, "test", classes))
    return _LISTINGS[key]


def _pillow() -> Any:
    """Return Pillow's Image module, or raise the one-line error that says how to install it."""
    try:
        from PIL import Image
    except ImportError:
        raise ConfigError("data.dataset: image-folder decodes images with Pillow, which is not installed; expected "
                          "pip install 'psframework[vision]' (or pip install pillow)") from None
    return Image


def decode(path: str, size: int) -> torch.Tensor:
    """Return an image file as RGB float32 (3, size, size) in [0, 1], resized as torchvision's Resize((s, s))."""
    image_module = _pillow()
    try:
        with image_module.open(path) as image:
            resized = image.convert("RGB").resize((size, size), image_module.BILINEAR)
    except Exception as exc:  # Pillow raises many kinds for a bad file; name the file in one line
        text = f"{type(exc).__name__}: {exc}"
        raise OSError(text if path in text else f"{path}: {text}") from None
    pixels = torch.from_numpy(np.array(resized, dtype=np.uint8)).permute(2, 0, 1)
    return pixels.to(torch.float32).div(255)  # as torchvision's ToTensor: a division, not a product by 1/255


class FolderSplit(torch.utils.data.Dataset):
    """The images of one split of an image folder, each decoded when it is read."""

    def __init__(self, paths: List[str], labels: List[int], classes: Tuple[str, ...], size: int) -> None:
        self.paths = paths
        self.targets = labels  # rank 0 reads labels from here, without decoding any image
        self.classes = list(classes)
        self.size = size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        return decode(self.paths[index], self.size), self.targets[index]


def _require_size(input_size: Optional[int]) -> int:
    """Return the model's input size; image-folder cannot do without one."""
    if input_size is None:
        raise ConfigError("model.input_size: not set, expected the height and width every image of data.dataset "
                          "image-folder is resized to (for example 224)")
    return input_size


def load_image_folder(data_cfg: Any, input_size: Optional[int]) -> Dataset:
    """Return the image folder at data.root as two streamed splits (normalised only if data.normalize says so)."""
    size = _require_size(input_size)
    found = listing(data_cfg.root)
    splits = [StreamedSplit(FolderSplit(*pair, found.classes, size), f"data.dataset: {NAME} {split} split",
                            len(found.classes), data_cfg.loader_workers, input_size=size)
              for split, pair in (("train", found.train), ("test", found.test))]
    dataset = Dataset(name=NAME, train=splits[0], test=splits[1], num_classes=len(found.classes),
                      augment=augmentation(data_cfg))
    # Not auto by default: it would decode the whole training split once before the first iteration.
    normalize(dataset.train, dataset.test, data_cfg.normalize or "none", data_cfg)
    return dataset


def folder_shape(data_cfg: Any) -> Tuple[int, int]:
    """Return (in_channels, num_classes) of an image folder: 3 (RGB) and its class count."""
    return 3, len(listing(data_cfg.root).classes)


def folder_image_shape(data_cfg: Any) -> Tuple[int, int, int]:
    """Return (3, height, width) of the first train image as stored (images may differ; each is resized)."""
    first = listing(data_cfg.root).train[0][0]
    try:
        with _pillow().open(first) as image:
            width, height = image.size
    except OSError as exc:
        raise ConfigError(f"data.root: {first} does not open as an image: {exc}") from None
    return 3, height, width
