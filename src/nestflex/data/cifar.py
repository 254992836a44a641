"""Real CIFAR-10 from the standard python-batch layout, read without trusting the pickles.

The official archive (``cifar-10-python.tar.gz``) holds ``cifar-10-batches-py/`` with
``data_batch_1`` .. ``data_batch_5``, ``test_batch`` and ``batches.meta``. They are pickles, and
unpickling runs whatever a file names, so this module never uses the unrestricted pickle
loaders: it reads them with :class:`_NumpyOnlyUnpickler`, which resolves only the few numpy
globals needed to rebuild arrays (plus ``_codecs.encode`` limited to latin-1, through which a
protocol-2 pickle written by Python 3 stores bytes) and refuses everything else (``os.system``,
``builtins.eval``, ...). Every batch is then checked (``data`` ``(N, 3072)`` uint8, ``labels``
``N`` ints in 0..9) before it becomes a tensor.

CIFAR-100 (:mod:`nestflex.data.cifar100`) uses the same row layout and is read through the same
unpickler and checks (:func:`_read_rows`), with its own keys and label ranges.

Downloading happens only when asked (``download=True``): the archive is fetched to a temporary
file, its md5 checked, extracted with tarfile's ``"data"`` filter into a staging directory and
renamed into place, so an interrupted download never leaves a half-written dataset behind.

Examples:
    >>> from nestflex.data.cifar import cifar10_available
    >>> cifar10_available("/nonexistent")
    False
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from nestflex.data._dataset import ImageTensorDataset
from nestflex.data._locate import find_dir, require_dir
from nestflex.errors import DataError

__all__ = [
    "CIFAR10",
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR10_URL",
    "CIFAR10_MD5",
    "CIFAR10_DIRNAME",
    "CIFAR10_TRAIN_FILES",
    "CIFAR10_TEST_FILE",
    "cifar10_available",
    "find_cifar10_dir",
    "require_cifar10_dir",
    "load_cifar10",
    "download_cifar10",
]

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_DIRNAME = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES: tuple[str, ...] = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_META_FILE = "batches.meta"
CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
#: Per-channel mean/std of the CIFAR-10 training set, in [0, 1] units.
CIFAR10_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)

_REQUIRED_FILES = CIFAR10_TRAIN_FILES + (CIFAR10_TEST_FILE,)
_EXPECTED = f"{CIFAR10_DIRNAME}/data_batch_1..5, test_batch"
_HINT = (
    "HINT: pass `download=True` (recipes: `--download`) to fetch it, put the extracted "
    f"`{CIFAR10_DIRNAME}` folder there, or use `--data synthetic` for the offline synthetic dataset"
)


# ------------------------------------------------------------------------------------------------
# Restricted unpickling
# ------------------------------------------------------------------------------------------------


def _latin1_bytes(text: Any, encoding: Any = "latin1") -> bytes:
    # Python 3 writes bytes into protocol-2 pickles as `_codecs.encode(text, "latin1")`; the
    # unpickler gets this function instead, which builds bytes and nothing else.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(
            f"global '_codecs.encode' is allowed only as encode(str, 'latin1'), got encoding {encoding!r}"
        )
    return text.encode("latin1")


def _numpy_globals() -> dict[tuple[str, str], Any]:
    # numpy 2 moved numpy.core to numpy._core; the official files (pickled by Python 2 and
    # numpy 1) name numpy.core, files written today name numpy._core. Both spellings map to the
    # objects below, resolved here, so the name in the file is never imported.
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    table: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_bytes,
    }
    for core in ("numpy.core", "numpy._core"):
        table[(f"{core}.multiarray", "_reconstruct")] = multiarray._reconstruct
        table[(f"{core}.multiarray", "scalar")] = multiarray.scalar
        table[(f"{core}.numeric", "_frombuffer")] = numeric._frombuffer
    return table


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that can rebuild numpy arrays, bytes and plain Python containers, and nothing else."""

    _ALLOWED = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"global '{module}.{name}' is forbidden (only numpy array reconstruction is allowed)"
            ) from None


def _unpickle(path: Path, what: str = "CIFAR-10") -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {what} file {path}: {exc}") from exc
    try:
        # latin1 is how Python 3 must decode the Python 2 byte strings of the official files.
        return _NumpyOnlyUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except Exception as exc:  # noqa: BLE001 - any failure to parse means "not a valid batch"
        raise DataError(
            f"{what} file {path} is corrupt or not a {what} python batch "
            f"({type(exc).__name__}: {exc}). HINT: delete {path.parent} and download or extract it again"
        ) from exc


def _as_str_keys(obj: Any, path: Path, what: str = "CIFAR-10") -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise DataError(f"{what} file {path} holds a {type(obj).__name__}, expected a dict")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _read_rows(
    path: Path, what: str, label_key: str, num_classes: int, other: str
) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate one python-batch file of CIFAR-10 or CIFAR-100.

    Returns ``(data (N, 3072) uint8, labels (N,) int64)`` with the labels of ``label_key``, each
    in ``0..num_classes-1``; ``other`` names the dataset a file lacking the keys probably is.
    """
    batch = _as_str_keys(_unpickle(path, what), path, what)
    missing = [k for k in ("data", label_key) if k not in batch]
    if missing:
        raise DataError(
            f"{what} file {path} lacks key(s) {missing}; found {sorted(map(str, batch))}. "
            f"HINT: is it a {other} or other dataset's file?"
        )
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        desc = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{what} file {path}: `data` must be a uint8 array of shape (N, 3072), got {desc}")
    try:
        labels = np.asarray(batch[label_key])
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{what} file {path}: `{label_key}` is not a list of integers ({exc})") from exc
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(
            f"{what} file {path}: `{label_key}` must be a list of integers, "
            f"got dtype {labels.dtype} shape {labels.shape}"
        )
    if len(labels) != len(data):
        raise DataError(f"{what} file {path}: {len(labels)} {label_key} for {len(data)} images")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(
            f"{what} file {path}: {label_key} must lie in 0..{num_classes - 1}, "
            f"got range {labels.min()}..{labels.max()}"
        )
    return data, labels.astype(np.int64)


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate one CIFAR-10 batch file; return ``(data (N, 3072) uint8, labels (N,) int64)``."""
    return _read_rows(path, "CIFAR-10", "labels", len(CIFAR10_CLASSES), other="CIFAR-100")


def _read_names(path: Path, key: str, count: int, what: str) -> tuple[str, ...]:
    """The ``count`` class names under ``key`` of a meta pickle (``batches.meta``, ``meta``)."""
    meta = _as_str_keys(_unpickle(path, what), path, what)
    names = meta.get(key)
    if isinstance(names, list):  # a file re-saved after loading with encoding="bytes" holds bytes names
        names = [n.decode("latin1") if isinstance(n, bytes) else n for n in names]
    valid = isinstance(names, list) and len(names) == count
    if not valid or not all(isinstance(n, str) for n in names):
        raise DataError(f"{what} file {path}: `{key}` must be a list of {count} strings, got {names!r:.200}")
    return tuple(names)


def _rows_to_images(data: np.ndarray) -> torch.Tensor:
    # Rows are 1024 red, 1024 green, 1024 blue values, each a row-major 32x32 plane.
    return torch.from_numpy(data).view(-1, 3, 32, 32).clone()


def _read_classes(directory: Path) -> tuple[str, ...]:
    path = directory / CIFAR10_META_FILE
    if not path.exists():  # the meta file only names the classes; the standard names serve
        return CIFAR10_CLASSES
    return _read_names(path, "label_names", len(CIFAR10_CLASSES), "CIFAR-10")


# ------------------------------------------------------------------------------------------------
# Locating and loading
# ------------------------------------------------------------------------------------------------


def _candidates(data_dir: str | os.PathLike[str]) -> list[Path]:
    root = Path(data_dir)
    return [root / CIFAR10_DIRNAME, root]


def _present(directory: Path) -> set[str]:
    return {f for f in _REQUIRED_FILES if (directory / f).is_file()}


def find_cifar10_dir(data_dir: str | os.PathLike[str]) -> Path | None:
    """The directory holding the CIFAR-10 batches: ``data_dir/cifar-10-batches-py`` or ``data_dir``.

    Returns ``None`` when neither holds all of ``data_batch_1..5`` and ``test_batch``. Only
    presence is checked; contents are validated when loaded.
    """
    return find_dir(_candidates(data_dir), _present, _REQUIRED_FILES)


def cifar10_available(data_dir: str | os.PathLike[str]) -> bool:
    """Whether CIFAR-10 batch files are present in ``data_dir`` (or its ``cifar-10-batches-py``).

    Args:
        data_dir: the directory to look in (need not exist).

    Examples:
        >>> cifar10_available("/nonexistent")
        False
    """
    return find_cifar10_dir(data_dir) is not None


def require_cifar10_dir(data_dir: str | os.PathLike[str]) -> Path:
    """Like :func:`find_cifar10_dir`, but raise when CIFAR-10 is missing.

    Raises:
        DataError: naming ``data_dir``, the missing files and how to get them.
    """
    return require_dir(Path(data_dir), _candidates(data_dir), _present, _REQUIRED_FILES, what="CIFAR-10",
                       expected=_EXPECTED, hint=_HINT)


def load_cifar10(
    data_dir: str | os.PathLike[str], split: str = "train"
) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """Load one CIFAR-10 split as tensors.

    Args:
        data_dir: directory holding ``cifar-10-batches-py/`` (or the batch files themselves).
        split: ``"train"`` (the five data batches) or ``"test"``.

    Returns:
        ``(images, targets, classes)``: uint8 ``(N, 3, 32, 32)``, int64 ``(N,)``, class names.

    Raises:
        DataError: unknown split; directory or files missing (the message lists the expected
            files and how to get them); a file corrupt, truncated, not a CIFAR batch, or one
            that tries to load anything but numpy arrays.
    """
    if split not in ("train", "test"):
        raise DataError(f"`split` must be 'train' or 'test', got {split!r}")
    directory = require_cifar10_dir(data_dir)
    files = CIFAR10_TRAIN_FILES if split == "train" else (CIFAR10_TEST_FILE,)
    parts = [_read_batch(directory / f) for f in files]
    data = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    return _rows_to_images(data), torch.from_numpy(labels), _read_classes(directory)


# ------------------------------------------------------------------------------------------------
# Download (only when asked)
# ------------------------------------------------------------------------------------------------


def _fetch(url: str, dest: Path, timeout: float = 60.0) -> None:
    """Stream ``url`` into ``dest``. Replaced in tests: no test touches the network."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as out:  # noqa: S310
        shutil.copyfileobj(response, out, length=1 << 20)


def _md5(path: Path) -> str:
    h = hashlib.md5()  # noqa: S324 - an integrity check against the published checksum
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download_cifar10(data_dir: str | os.PathLike[str]) -> Path:
    """Download and extract CIFAR-10 into ``data_dir`` unless it is already there.

    Args:
        data_dir: target directory; created if missing. The batches end up in
            ``data_dir/cifar-10-batches-py``.

    Returns:
        The directory holding the batch files.

    Raises:
        DataError: the download fails, the md5 differs from :data:`CIFAR10_MD5`, the archive is
            unreadable or lacks files, or an incomplete ``cifar-10-batches-py`` is in the way.
    """
    found = find_cifar10_dir(data_dir)
    if found is not None:
        return found
    root = Path(data_dir)
    target = root / CIFAR10_DIRNAME
    if target.exists():
        # Never delete what a user put there; an incomplete copy needs a person's decision.
        raise DataError(
            f"{target} exists but is incomplete (expected {_EXPECTED}). "
            "HINT: delete it, then download again"
        )
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".cifar-10-", suffix=".tar.gz.part", dir=root)
    os.close(fd)
    archive = Path(tmp_name)
    try:
        try:
            _fetch(CIFAR10_URL, archive)
        except OSError as exc:  # URLError, timeouts and disk errors are all OSErrors
            raise DataError(
                f"downloading CIFAR-10 from {CIFAR10_URL} failed: {exc}. "
                "HINT: check the network, or use `--data synthetic` for the offline synthetic dataset"
            ) from exc
        digest = _md5(archive)
        if digest != CIFAR10_MD5:
            raise DataError(
                f"the file downloaded from {CIFAR10_URL} has md5 {digest}, expected {CIFAR10_MD5}; "
                "it was deleted. HINT: retry, or download and extract it by hand into "
                f"{root}"
            )
        staging = Path(tempfile.mkdtemp(prefix=".cifar-10-extract-", dir=root))
        try:
            try:
                with tarfile.open(archive, "r:gz") as tar:
                    tar.extractall(staging, filter="data")
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise DataError(f"cannot extract the CIFAR-10 archive from {CIFAR10_URL}: {exc}") from exc
            extracted = staging / CIFAR10_DIRNAME
            if find_cifar10_dir(extracted) != extracted:
                raise DataError(f"the CIFAR-10 archive from {CIFAR10_URL} lacks {_EXPECTED}")
            # Same filesystem, so the rename is atomic: the batches appear complete or not at all.
            os.replace(extracted, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        archive.unlink(missing_ok=True)
    return target


# ------------------------------------------------------------------------------------------------
# Dataset
# ------------------------------------------------------------------------------------------------


class CIFAR10(ImageTensorDataset):
    """CIFAR-10 as a torch ``Dataset`` of ``(image, label)``, held in memory as uint8.

    Args:
        data_dir: directory holding ``cifar-10-batches-py/`` (or the batch files themselves).
        split: ``"train"`` (50,000 images) or ``"test"`` (10,000).
        transform: callable applied to each uint8 ``(3, 32, 32)`` image; ``None`` returns
            float32 in [0, 1].
        download: fetch the dataset first if it is not in ``data_dir``. Off by default: nothing
            is downloaded unless asked.

    Raises:
        DataError: see :func:`load_cifar10` and :func:`download_cifar10`.

    Examples:
        >>> ds = CIFAR10("./data", split="test")  # doctest: +SKIP
        >>> ds.images.shape  # doctest: +SKIP
        torch.Size([10000, 3, 32, 32])
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        split: str = "train",
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        download: bool = False,
    ) -> None:
        if download:
            download_cifar10(data_dir)
        images, targets, classes = load_cifar10(data_dir, split)
        super().__init__(images, targets, classes=classes, transform=transform)
        self.split = split
