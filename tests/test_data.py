"""Dataset readers on small files written here, and deterministic order and sharding."""

from __future__ import annotations

import gzip
import pickle
import struct

import numpy as np
import pytest

from psframework.config import load_config
from psframework.data import DatasetError, epoch_order, iterate_batches, load_dataset, shard
from psframework.data.cifar import load_cifar10, read_batch
from psframework.data.idx import MNIST_FILES, load_mnist_like, read_idx
from psframework.data.loader import shard_bounds


IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0D: ">f4", 0x0E: ">f8"}


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    """Encode an array as an IDX file of the given element type."""
    array = np.asarray(array)
    header = struct.pack(">HBB", 0, type_code, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    return header + array.astype(IDX_DTYPES[type_code]).tobytes()


def assert_one_line_error(call, path, phrase: str) -> None:
    """Check that call raises a one-line DatasetError naming path and containing phrase."""
    with pytest.raises(DatasetError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    assert str(path) in message, message
    assert phrase in message, message


def write_mnist(root, n_train=20, n_test=8, compress=False, rng=None):
    rng = rng or np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28)),
        "train_labels": rng.integers(0, 10, n_train),
        "test_images": rng.integers(0, 256, (n_test, 28, 28)),
        "test_labels": rng.integers(0, 10, n_test),
    }
    for key, stem in MNIST_FILES.items():
        data = idx_bytes(arrays[key])
        if compress:
            (root / (stem + ".gz")).write_bytes(gzip.compress(data))
        else:
            (root / stem).write_bytes(data)
    return arrays


@pytest.mark.parametrize("compress", [False, True])
def test_idx_round_trip(tmp_path, compress):
    arrays = write_mnist(tmp_path, compress=compress)
    train_x, train_y, test_x, test_y = load_mnist_like(str(tmp_path))
    assert train_x.shape == (20, 1, 28, 28) and test_x.shape == (8, 1, 28, 28)
    np.testing.assert_array_equal(train_x[:, 0], arrays["train_images"])
    np.testing.assert_array_equal(test_y, arrays["test_labels"])


def test_idx_errors_name_the_file(tmp_path):
    write_mnist(tmp_path)
    path = tmp_path / MNIST_FILES["train_images"]
    good = path.read_bytes()
    path.write_bytes(good[:-10])
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte: truncated"):
        load_mnist_like(str(tmp_path))
    path.write_bytes(b"\x12\x34" + good[2:])
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte: bad magic number"):
        load_mnist_like(str(tmp_path))
    path.write_bytes(good + b"xx")
    with pytest.raises(DatasetError, match="trailing bytes"):
        load_mnist_like(str(tmp_path))
    path.write_bytes(good[:6])
    with pytest.raises(DatasetError, match="truncated header"):
        read_idx(str(path))
    path.unlink()
    with pytest.raises(DatasetError, match=r"missing file .*train-images-idx3-ubyte\[\.gz\]"):
        load_mnist_like(str(tmp_path))
    bad_gz = tmp_path / (MNIST_FILES["train_images"] + ".gz")
    bad_gz.write_bytes(gzip.compress(good)[:40])
    with pytest.raises(DatasetError, match="corrupt file"):
        load_mnist_like(str(tmp_path))


def test_idx_label_count_mismatch(tmp_path):
    write_mnist(tmp_path)
    (tmp_path / MNIST_FILES["train_labels"]).write_bytes(idx_bytes(np.zeros(5, dtype=np.uint8)))
    with pytest.raises(DatasetError, match="20 images but 5 labels"):
        load_mnist_like(str(tmp_path))


def nan_image_at(image: int, row: int, col: int, value: float = np.nan) -> np.ndarray:
    """Return 20 float images with one bad pixel."""
    images = np.zeros((20, 28, 28))
    images[image, row, col] = value
    return images


@pytest.mark.parametrize("key, array, type_code, phrase", [
    ("train_images", nan_image_at(2, 3, 4), 0x0D,
     "1 non-finite pixel values (first nan at image 2, row 3, column 4); expected finite pixel values"),
    ("train_images", nan_image_at(0, 0, 1, np.inf), 0x0E, "first inf at image 0, row 0, column 1"),
    ("train_images", nan_image_at(19, 27, 27, -np.inf), 0x0D, "first -inf at image 19, row 27, column 27"),
    ("test_labels", [0, 1, 2, 1.7, 4, 5, 6, 7], 0x0D,
     "1 non-integer labels (first 1.7 at index 3); expected integer labels 0..9"),
    ("test_labels", [0, 1, 2, 3, 4, 5, 6, np.nan], 0x0E, "non-integer labels (first nan at index 7)"),
    ("test_labels", [0, 1, 2, 3, np.inf, 5, 6, 7], 0x0E, "non-integer labels (first inf at index 4)"),
    ("test_labels", [0, 1, 12, 3, 4, 5, 6, 7], 0x08,
     "1 labels outside 0..9 (first 12 at index 2); expected integer labels 0..9"),
    ("test_labels", [0, -1, 2, 3, 4, 5, 6, -2], 0x09, "2 labels outside 0..9 (first -1 at index 1)"),
    ("test_labels", [10.0, 1, 2, 3, 4, 5, 6, 7], 0x0D, "labels outside 0..9 (first 10.0 at index 0)"),
])
def test_idx_bad_values_name_the_file(tmp_path, key, array, type_code, phrase):
    write_mnist(tmp_path)
    path = tmp_path / MNIST_FILES[key]
    path.write_bytes(idx_bytes(array, type_code))
    assert_one_line_error(lambda: load_mnist_like(str(tmp_path)), path, phrase)


@pytest.mark.parametrize("type_code", [0x0D, 0x0E])
def test_idx_float_files_with_clean_values_load(tmp_path, type_code):
    arrays = write_mnist(tmp_path)
    for key in ("train_images", "train_labels"):
        (tmp_path / MNIST_FILES[key]).write_bytes(idx_bytes(arrays[key], type_code))
    train_x, train_y, _, _ = load_mnist_like(str(tmp_path))
    assert train_y.dtype == np.int64
    np.testing.assert_array_equal(train_y, arrays["train_labels"])
    np.testing.assert_array_equal(train_x[:, 0], arrays["train_images"])


def write_cifar(root, per_batch=6):
    rng = np.random.default_rng(1)
    directory = root / "cifar-10-batches-py"
    directory.mkdir()
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072)).astype(np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, per_batch)]}
        (directory / name).write_bytes(pickle.dumps(batch, protocol=2))
    return directory


def test_cifar_round_trip(tmp_path):
    directory = write_cifar(tmp_path)
    train_x, train_y, test_x, test_y = load_cifar10(str(tmp_path))
    assert train_x.shape == (30, 3, 32, 32) and train_y.shape == (30,)
    assert test_x.shape == (6, 3, 32, 32)
    first = pickle.loads((directory / "data_batch_1").read_bytes())
    np.testing.assert_array_equal(train_x[:6].reshape(6, -1), first[b"data"])
    # The directory of the batches itself is accepted as data.root too.
    assert load_cifar10(str(directory))[0].shape == (30, 3, 32, 32)


def test_cifar_errors(tmp_path):
    directory = write_cifar(tmp_path)
    path = directory / "data_batch_3"
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(DatasetError, match="data_batch_3: cannot unpickle"):
        load_cifar10(str(tmp_path))
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(DatasetError, match=r"expected uint8 \(N, 3072\)"):
        read_batch(str(path))
    path.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(DatasetError, match="holds list"):
        read_batch(str(path))

    class Evil:
        def __reduce__(self):
            return (print, ("never runs",))

    path.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(DatasetError, match="refusing to load builtins.print"):
        read_batch(str(path))
    (directory / "test_batch").unlink()
    path.write_bytes(good)
    with pytest.raises(DatasetError, match="missing file .*test_batch"):
        load_cifar10(str(tmp_path))


def write_batch(path, data=None, labels=None) -> None:
    """Write one pickled batch; by default three black images labelled 0, 1, 2."""
    data = np.zeros((3, 3072), np.uint8) if data is None else data
    labels = [0, 1, 2] if labels is None else labels
    path.write_bytes(pickle.dumps({b"data": data, b"labels": labels}, protocol=2))


@pytest.mark.parametrize("labels, phrase", [
    ([b"cat", b"dog", b"cat"], "label b'cat' at index 0 is bytes, not an integer"),
    (["1", "2", "3"], "label '1' at index 0 is str, not an integer"),
    (np.array(["1", "2", "3"]), "label '1' at index 0 is str, not an integer"),
    ([np.str_("1"), 0, 0], "label '1' at index 0 is str, not an integer"),
    ("012", "labels are str"),
    (b"\x00\x01\x02", "labels are bytes"),
    ({0: 1, 1: 2, 2: 3}, "labels are a dict"),
    ({b"a": [0, 1, 2]}, "labels are a dict"),
    (7, "labels are int"),
    (np.zeros((3, 1)), "labels are an array of shape (3, 1)"),
    ([0, 1, 2, 3], "3 images but 4 labels"),
    ([0, 1.7, 2], "label 1.7 at index 1 is not an integer"),
    ([0, 1, np.float32(2.5)], "label 2.5 at index 2 is not an integer"),
    ([0, 1, float("nan")], "label nan at index 2 is not an integer"),
    ([float("inf"), 1, 2], "label inf at index 0 is not an integer"),
    ([[0, 1], [2], []], "label [0, 1] at index 0 is list, not an integer"),
    ([0, np.zeros((4, 4)), 2], "at index 1 is ndarray, not an integer"),
    ([0, None, 2], "label None at index 1 is NoneType, not an integer"),
    ([True, False, True], "label True at index 0 is a bool, not an integer"),
    (np.array([False, True, True]), "label False at index 0 is a bool, not an integer"),
    ([0, 1, 10], "label 10 at index 2 is outside 0..9"),
    ([0, -1, 2], "label -1 at index 1 is outside 0..9"),
    ([0, 1, 2 ** 70], "at index 2 is outside 0..9"),
])
def test_cifar_bad_labels_name_the_file(tmp_path, labels, phrase):
    path = tmp_path / "data_batch_1"
    write_batch(path, labels=labels)
    assert_one_line_error(lambda: read_batch(str(path)), path, phrase)
    assert_one_line_error(lambda: read_batch(str(path)), path, "expected 3 integer labels 0..9")


def test_cifar_labels_none_name_the_file(tmp_path):
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": np.zeros((3, 3072), np.uint8), b"labels": None}, protocol=2))
    assert_one_line_error(lambda: read_batch(str(path)), path, "labels are None; expected 3 integer labels 0..9")
    path.write_bytes(pickle.dumps({b"data": np.zeros((3, 3072), np.uint8)}, protocol=2))
    assert_one_line_error(lambda: read_batch(str(path)), path, "no data/labels entries")


@pytest.mark.parametrize("data, phrase", [
    (["abc", "def"], "data is list, expected uint8 (N, 3072)"),
    ([[0] * 3072] * 3, "data is list, expected uint8 (N, 3072)"),
    ({b"x": 1}, "data is a dict, expected uint8 (N, 3072)"),
    ("pixels", "data is str, expected uint8 (N, 3072)"),
    (b"\x00" * 3072, "data is bytes, expected uint8 (N, 3072)"),
    (np.array(["abc", "def"]), "data is <U3 (2,), expected uint8 (N, 3072)"),
    (np.zeros((3, 3072), np.float32), "data is float32 (3, 3072), expected uint8 (N, 3072)"),
    (np.zeros(3072, np.uint8), "data is uint8 (3072,), expected uint8 (N, 3072)"),
])
def test_cifar_bad_data_names_the_file(tmp_path, data, phrase):
    path = tmp_path / "test_batch"
    write_batch(path, data=data)
    assert_one_line_error(lambda: read_batch(str(path)), path, phrase)


def test_cifar_data_none_names_the_file(tmp_path):
    path = tmp_path / "test_batch"
    path.write_bytes(pickle.dumps({b"data": None, b"labels": [0, 1, 2]}, protocol=2))
    assert_one_line_error(lambda: read_batch(str(path)), path, "data is None, expected uint8 (N, 3072)")


@pytest.mark.parametrize("labels", [
    [0, 1, 2], (0, 1, 2), [0, 1.0, np.int64(2)], [np.uint8(0), np.float64(1.0), 2],
    np.array([0, 1, 2], np.uint8), np.array([0.0, 1.0, 2.0]),
])
def test_cifar_integral_labels_are_accepted(tmp_path, labels):
    path = tmp_path / "data_batch_1"
    write_batch(path, labels=labels)
    images, read = read_batch(str(path))
    assert images.shape == (3, 3, 32, 32) and read.dtype == np.int64
    np.testing.assert_array_equal(read, [0, 1, 2])


def test_file_datasets_through_the_config(tmp_path):
    write_mnist(tmp_path)
    cfg = load_config(None, ["data.dataset=fashion-mnist", f"data.root={tmp_path}"])
    data = load_dataset(cfg.data, input_size=32)
    assert data.image_shape == (1, 32, 32) and len(data.train) == 20 and data.num_classes == 10
    assert abs(float(data.train.images.mean())) < 1e-4


def test_digits_split_is_fixed_and_standardised():
    cfg = load_config(None)
    a = load_dataset(cfg.data, 28)
    b = load_dataset(load_config(None, ["data.seed=5"]).data, 28)
    assert len(a.train) + len(a.test) == 1797 and len(a.test) == 359
    assert a.image_shape == (1, 28, 28)
    assert (a.test.labels == b.test.labels).all()


def test_synthetic_is_seeded_and_class_conditional():
    over = ["data.dataset=synthetic", "data.synthetic.train_size=300", "data.synthetic.test_size=50",
            "data.synthetic.height=16", "data.synthetic.width=12", "data.synthetic.noise=0.5"]
    a = load_dataset(load_config(None, over).data)
    b = load_dataset(load_config(None, over).data)
    c = load_dataset(load_config(None, over + ["data.seed=1"]).data)
    assert a.image_shape == (3, 16, 12)
    assert (a.train.images == b.train.images).all()
    assert not (a.train.images == c.train.images).all()
    # Nearest class mean separates the classes: the labels carry signal.
    x, y = a.train.images.reshape(300, -1), a.train.labels
    means = np.stack([x[y == c].mean(0).numpy() for c in range(10)])
    pred = ((x.numpy()[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == y.numpy()).mean() > 0.9


def test_epoch_order_and_sharding_are_deterministic():
    assert (epoch_order(100, 3, 0) == epoch_order(100, 3, 0)).all()
    assert not (epoch_order(100, 3, 0) == epoch_order(100, 3, 1)).all()
    assert not (epoch_order(100, 3, 0) == epoch_order(100, 4, 0)).all()
    batches = list(iterate_batches(100, 16, seed=3, epoch=0))
    assert len(batches) == 6 and all(len(b) == 16 for b in batches)
    assert len(list(iterate_batches(100, 16, seed=3, epoch=0, drop_last=False))) == 7
    rest = list(iterate_batches(100, 16, seed=3, epoch=0, start=4))
    assert all((x == y).all() for x, y in zip(rest, batches[4:]))
    batch = batches[0]
    for n in (1, 3, 4, 5):
        parts = [shard(batch, w, n) for w in range(n)]
        assert (np.concatenate(parts) == batch).all()
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert shard_bounds(10, 4) == [0, 3, 6, 8, 10]
    with pytest.raises(ValueError, match="worker 4 out of range for n=4"):
        shard(batch, 4, 4)


def test_the_digits_read_directly_are_those_of_scikit_learn(monkeypatch):
    from sklearn.datasets import load_digits

    from psframework.data import registry

    bunch = load_digits()
    images, labels = registry.read_digits()
    assert registry.digits_file() is not None  # the direct path is the one taken here
    assert images.dtype == bunch.images.dtype and np.array_equal(images, bunch.images)
    assert np.array_equal(labels, bunch.target)
    monkeypatch.setattr(registry, "digits_file", lambda: None)  # the file moved: scikit-learn reads it
    again, again_labels = registry.read_digits()
    assert np.array_equal(again, bunch.images) and np.array_equal(again_labels, bunch.target)
