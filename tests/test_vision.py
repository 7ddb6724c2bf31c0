"""A torchvision classification model by name and an image folder of the user's, under every scheme.

tests/tvlike.py has torchvision's factories' exact signature, for the tests that need no torchvision; the runs
under every scheme use torchvision's own ResNet-18 (the extra vision, which hpc/test.sh installs).
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image
from test_any_model import CODED, CONFIG, PARALLEL, assert_same_run, run

from psframework.cli import main
from psframework.config import DataConfig, ModelConfig, load_config
from psframework.data import DatasetError, dataset_shape, image_shape, load_dataset
from psframework.errors import ConfigError
from psframework.imports import call_factory
from psframework.models import build_model
from psframework.models.zoo import VIA_KWARGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TVLIKE = os.path.join(ROOT, "tests", "tvlike.py") + ":resnet18"  # a file path: found from any directory
CLASSES = ("ant", "bee", "cat")
SIZES = [(10, 13), (20, 17), (31, 31), (9, 12)]  # (height, width) of the images, in turn
SIZE = 12  # model.input_size: every image is resized


def make_folder(root, classes=CLASSES, counts=(("train", 4), ("test", 2)), seed=0):
    """Write ROOT/split/CLASS/i.png of random pixels in several sizes (one grayscale image per class); return ROOT."""
    rng = np.random.default_rng(seed)
    for split, count in counts:
        for name in classes:
            os.makedirs(root / split / name)
            for i in range(count):
                height, width = SIZES[i % len(SIZES)]
                pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
                image = Image.fromarray(pixels)
                (image.convert("L") if i == 1 else image).save(root / split / name / f"{i}.png")
    return root


def pillow_resized(path, size=SIZE):
    """Return an image as torchvision's Resize((size, size)) and ToTensor make it on a PIL image."""
    resized = Image.open(path).convert("RGB").resize((size, size), Image.BILINEAR)
    return torch.from_numpy(np.array(resized)).permute(2, 0, 1).float().div(255)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("images"))


def folder_config(root, **values):
    return DataConfig(dataset="image-folder", root=str(root), **values)


# ---------------------------------------------------------------- the image folder

def test_an_image_folder_loads_resized_rgb_images_with_labels_by_sorted_class(folder):
    data = folder_config(folder)
    assert dataset_shape(data) == (3, 3) and image_shape(data) == (3, 10, 13)  # the first train image, as stored
    dataset = load_dataset(data, SIZE)
    assert (len(dataset.train), len(dataset.test), dataset.num_classes) == (12, 6, 3)
    assert dataset.image_shape == (3, SIZE, SIZE)
    images, labels = dataset.train.fetch(np.arange(12))
    assert images.dtype == torch.float32 and images.shape == (12, 3, SIZE, SIZE)
    assert labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert dataset.test.labels_of(np.arange(6)).tolist() == [0, 0, 1, 1, 2, 2]
    for index, path in ((5, folder / "train" / "bee" / "1.png"), (10, folder / "train" / "cat" / "2.png")):
        assert torch.equal(images[index], pillow_resized(path))
    gray = images[5]
    assert torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2])  # a grayscale file, made RGB
    test_images, _ = dataset.test.fetch(np.array([3]))
    assert torch.equal(test_images[0], pillow_resized(folder / "test" / "bee" / "1.png"))


def test_crop_flip_and_auto_normalisation_apply_to_the_streamed_folder(folder):
    dataset = load_dataset(folder_config(folder, augment="crop-flip", augment_padding=2, normalize="auto"), SIZE)
    images, _ = dataset.train.fetch(np.arange(12))
    mean = images.mean(dim=(0, 2, 3))
    assert torch.allclose(mean, torch.zeros(3), atol=1e-5)  # statistics of the whole training split
    indices = np.array([7, 2])
    first, _ = dataset.train_batch(indices, epoch=1)
    again, _ = dataset.train_batch(indices[::-1].copy(), epoch=1)
    assert torch.equal(first, again.flip(0))  # a pure function of (seed, epoch, index), whatever the batch


@pytest.mark.parametrize("make, expected", [
    (lambda root: (root / "test" / "a").mkdir(parents=True), "has no train folder"),
    (lambda root: (root / "train").mkdir(), "train has no class folder"),
    (lambda root: ((root / "train" / "a").mkdir(parents=True), (root / "train" / "a" / "notes.txt").write_text("")),
     "class folder .*train/a has no image"),
    (lambda root: (make_folder(root, ("a",)), make_folder(root, ("zebra",), (("test", 1),))),
     "test/zebra is a class that .*train does not have"),
    (lambda root: make_folder(root, ("a",), (("train", 1),)), "has no test folder"),
])
def test_a_wrong_folder_layout_is_one_line_naming_what_is_missing(tmp_path, make, expected):
    make(tmp_path)
    with pytest.raises(ConfigError, match=expected) as caught:
        load_dataset(folder_config(tmp_path), SIZE)
    assert "\n" not in str(caught.value)


def test_an_image_that_does_not_decode_is_one_line_naming_its_file(tmp_path):
    make_folder(tmp_path, ("a", "b"), (("train", 2), ("test", 1)))
    (tmp_path / "train" / "b" / "9.png").write_bytes(b"not an image")
    dataset = load_dataset(folder_config(tmp_path), SIZE)
    with pytest.raises(DatasetError, match=r"sample 4 does not load: .*train/b/9\.png") as caught:
        dataset.train.fetch(np.array([4]))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("overrides, expected", [
    ([], "data.root: dataset image-folder needs data.root"),
    (["data.root=/no/such/folder"], "data.root: got '/no/such/folder', which is not a directory"),
    (["data.root=."], "model.input_size: not set"),  # a model from a factory has no default size
])
def test_the_config_refuses_an_image_folder_without_root_or_size(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(None, ["data.dataset=image-folder", f"model.name={TVLIKE}", *overrides])


# ---------------------------------------------------------------- factories and the channel check

def torchvision_like(*, weights=None, progress=True, **kwargs):
    return kwargs


def test_a_factory_with_torchvisions_signature_gets_num_classes_and_never_in_channels():
    offered = {"in_channels": 1, "num_classes": 7}
    assert call_factory(torchvision_like, {}, "model.name", offered, VIA_KWARGS) == {"num_classes": 7}
    assert call_factory(torchvision_like, {"num_classes": 4}, "model.name", offered, VIA_KWARGS) == {"num_classes": 4}


def test_a_factory_gets_the_offered_keywords_its_signature_names_and_no_others():
    def named(in_channels, width=2):
        return in_channels, width

    def neither(width=3):
        return width

    offered = {"in_channels": 1, "num_classes": 7}
    assert call_factory(named, {}, "model.name", offered, VIA_KWARGS) == (1, 2)
    assert call_factory(neither, {}, "model.name", offered, VIA_KWARGS) == 3


def test_a_torchvision_style_model_is_built_with_the_datasets_classes():
    model = build_model(ModelConfig(name=TVLIKE), 3, 5)
    assert model.fc.out_features == 5
    assert build_model(ModelConfig(name=TVLIKE, args={"num_classes": 4}), 3, 5).fc.out_features == 4


def test_a_model_whose_first_convolution_takes_other_channels_is_one_line_naming_both(capsys):
    with pytest.raises(ConfigError, match=r"takes 3-channel images .*conv1.* the data have 1 channel; expected"):
        build_model(ModelConfig(name=TVLIKE), 1, 10)
    assert main(["check", CONFIG, f"model.name={TVLIKE}", "model.input_size=8"]) == 2  # the 1-channel digits
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "3-channel" in lines[0] and "1 channel" in lines[0], lines


# ---------------------------------------------------------------- training under every scheme

def folder_run(root, iterations):
    return ["data.dataset=image-folder", f"data.root={root}", f"model.name={TVLIKE}", f"model.input_size={SIZE}",
            "data.batch_size=6", "data.augment=crop-flip", "data.augment_padding=2", "data.normalize=auto",
            f"train.max_iterations={iterations}"]


COMPARED = ("sazd", "ps")  # torchvision's ResNet-18 over 5 iterations against the reference trainer


@pytest.fixture(scope="module")
def folder_reference(tmp_path_factory, folder):
    return run(tmp_path_factory.mktemp("ref"), CONFIG, 1, ["scheme=reference", *folder_run(folder, 5)], "ref")


def test_the_reference_trainer_trains_a_torchvision_style_model_on_an_image_folder(folder_reference):
    summary = json.loads((folder_reference / "summary.json").read_text())
    assert summary["iterations"] == 5 and summary["dataset"] == "image-folder"
    assert summary["final_test_accuracy"] is not None


# ---------------------------------------------------------------- the real torchvision ResNet-18

TORCHVISION = "torchvision.models:resnet18"
BN_FREE = os.path.join(ROOT, "tests", "tvfree.py") + ":resnet18"  # torchvision's ResNet-18 without BatchNorm
needs_torchvision = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                                       reason="torchvision is not installed (the extra vision: hpc/test.sh has it)")


def resnet18_run(root, iterations, name=TORCHVISION):
    return ["data.dataset=image-folder", f"data.root={root}", f"model.name={name}", "model.args.num_classes=10",
            "model.input_size=16", "data.batch_size=8", f"train.max_iterations={iterations}"]


@pytest.fixture(scope="module")
def ten_classes(tmp_path_factory):
    classes = tuple(f"class{i}" for i in range(10))
    return make_folder(tmp_path_factory.mktemp("ten"), classes, (("train", 2), ("test", 1)))


@pytest.fixture(scope="module")
def resnet18_reference(tmp_path_factory, ten_classes):
    """The reference trainer's 5 iterations of torchvision's ResNet-18 without BatchNorm."""
    overrides = ["scheme=reference", *resnet18_run(ten_classes, 5, BN_FREE)]
    return run(tmp_path_factory.mktemp("tvref"), CONFIG, 1, overrides)


@needs_torchvision
@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("scheme", ["reference", *CODED, *PARALLEL])
def test_torchvisions_resnet18_trains_on_an_image_folder_under_every_scheme(tmp_path, ten_classes, scheme):
    ranks, overrides = {"reference": (1, ["scheme=reference"]), **CODED, **PARALLEL}[scheme]
    run_dir = run(tmp_path, CONFIG, ranks, [*resnet18_run(ten_classes, 2), *overrides])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 2 and summary["model"] == TORCHVISION


@needs_torchvision
@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("scheme", COMPARED)
def test_torchvisions_resnet18_equals_the_reference_trainer(tmp_path, ten_classes, resnet18_reference, scheme):
    """Without BatchNorm, as the other ResNet tests: data-parallel BatchNorm sees shards, and BatchNorm over the
    8 values of a 1x1 feature map amplifies the rounding of decoding far beyond 1e-4."""
    ranks, overrides = {**CODED, **PARALLEL}[scheme]
    run_dir = run(tmp_path, CONFIG, ranks, [*resnet18_run(ten_classes, 5, BN_FREE), *overrides])
    assert_same_run(run_dir, resnet18_reference)
