"""HDSearch end to end over gRPC: leaves holding vector shards, the LSH mid-tier, recall measured
against numpy brute force on Fashion-MNIST (Debian dataset-fashion-mnist) and seeded synthetic data.

Needs the built services (``scripts/build-services``; binaries under ``services/build`` or
``$MUSKU_SERVICES_BUILD``); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from musku.errors import InputError, UnsupportedError
from musku.services import datasets
from tests.services import servers

pytestmark = pytest.mark.services

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("MUSKU_SERVICES_BUILD", REPO / "services" / "build"))
BIN = BUILD / "hdsearch"
NAMES = ("hdsearch_leaf", "hdsearch_midtier", "hdsearch_client")


class Deployment:
    def __init__(self, tmp: Path, data: Path, shards: int, mid_args: tuple[str, ...] = ()) -> None:
        self.tmp, self.procs = tmp, []
        try:
            ports = []
            for s in range(shards):
                p, port = servers.start(
                    [
                        str(BIN / "hdsearch_leaf"),
                        "--data",
                        str(data),
                        "--shard",
                        str(s),
                        "--shards",
                        str(shards),
                    ],
                    tmp / f"leaf{s}.port",
                )
                self.procs.append(p)
                ports.append(port)
            self.leaves = list(self.procs)
            mid, self.port = servers.start(
                [
                    str(BIN / "hdsearch_midtier"),
                    "--data",
                    str(data),
                    "--leaves",
                    ",".join(f"127.0.0.1:{p}" for p in ports),
                    "--leaf-timeout-ms",
                    "2000",
                    *mid_args,
                ],
                tmp / "mid.port",
            )
            self.procs.append(mid)
        except BaseException:
            self.stop()
            raise

    def search(
        self, queries: Path, k: int = 10, *extra: str
    ) -> tuple[dict[str, float], np.ndarray, int]:
        out = self.tmp / "ids.bin"
        r = subprocess.run(
            [
                str(BIN / "hdsearch_client"),
                "--target",
                f"127.0.0.1:{self.port}",
                "--queries",
                str(queries),
                "--k",
                str(k),
                "--out",
                str(out),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        stats = json.loads(r.stdout) if r.stdout.strip() else {}
        ids = (
            np.fromfile(out, dtype="<u4").reshape(-1, k)
            if out.exists() and k > 0
            else np.empty((0, 0))
        )
        return stats, ids, r.returncode

    def stop(self) -> None:
        servers.stop_all(self.procs)


def _need_binaries() -> None:
    for n in NAMES:
        if not (BIN / n).exists():
            pytest.skip(f"{BIN / n} not built (run scripts/build-services)")


@pytest.fixture(scope="module")
def fashion(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    _need_binaries()
    tmp = tmp_path_factory.mktemp("fashion")
    try:
        train, test = datasets.fashion_mnist("train")[:20000], datasets.fashion_mnist("test")[:200]
    except UnsupportedError as e:
        pytest.skip(str(e))
    datasets.write_vectors(tmp / "data.bin", train)
    datasets.write_vectors(tmp / "queries.bin", test)
    return tmp / "data.bin", tmp / "queries.bin", datasets.brute_force_knn(train, test, 10)


@pytest.fixture(scope="module")
def fashion_deployment(
    fashion: tuple[Path, Path, np.ndarray], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    d = Deployment(tmp_path_factory.mktemp("fdep"), fashion[0], shards=3)
    yield d
    d.stop()


def test_fashion_mnist_recall_at_10_vs_brute_force(
    fashion: tuple[Path, Path, np.ndarray], fashion_deployment: Deployment
) -> None:
    stats, ids, rc = fashion_deployment.search(fashion[1])
    assert rc == 0, stats
    recall = datasets.recall_at_k(ids, fashion[2])
    print(f"fashion-mnist 20000x784, 3 leaves: recall@10 {recall:.3f}, {stats}")
    assert recall >= 0.93
    # LSH must prune: far fewer candidates than the data set.
    assert stats["mean_candidates"] < 20000 * 0.3


def test_fashion_mnist_pca_features_recall_and_pruning(tmp_path: Path) -> None:
    """The services' default HDSearch data: the images' top 64 principal components."""
    _need_binaries()
    try:
        d_path, q_path = datasets.hdsearch_data(tmp_path, source="fashion-mnist", n=20000,
                                                nq=200, pca=64)  # fmt: skip
    except UnsupportedError as e:
        pytest.skip(str(e))
    data, q = datasets.read_vectors(d_path), datasets.read_vectors(q_path)
    assert data.shape == (20000, 64) and q.shape == (200, 64)
    d = Deployment(tmp_path, d_path, shards=2)
    try:
        stats, ids, rc = d.search(q_path)
        assert rc == 0, stats
        recall = datasets.recall_at_k(ids, datasets.brute_force_knn(data, q, 10))
        print(f"fashion-mnist 20000 x 64 PCA, 2 leaves: recall@10 {recall:.3f}, {stats}")
        assert recall >= 0.93
        assert stats["mean_candidates"] < 20000 * 0.1
    finally:
        d.stop()


def test_synthetic_recall_and_k_sizes(tmp_path: Path) -> None:
    _need_binaries()
    datasets.write_synthetic_vectors(tmp_path / "d.bin", 8000, 256, seed=3, clusters=64)
    q = datasets.synthetic_queries(100, 256, seed=3, clusters=64)
    datasets.write_vectors(tmp_path / "q.bin", q)
    data = datasets.read_vectors(tmp_path / "d.bin")
    d = Deployment(
        tmp_path,
        tmp_path / "d.bin",
        shards=2,
        mid_args=("--threading", "async-dispatch-block", "--workers", "2", "--responders", "1"),
    )
    try:
        for k in (1, 10, 50):
            stats, ids, rc = d.search(tmp_path / "q.bin", k)
            assert rc == 0, stats
            recall = datasets.recall_at_k(ids, datasets.brute_force_knn(data, q, k))
            print(f"synthetic 8000x256 k={k}: recall {recall:.3f} {stats}")
            assert recall >= 0.93
            assert ((ids < 8000).all(axis=1)).mean() > 0.9  # full answers
            assert all(len(set(row.tolist())) == len(row) for row in ids)  # no duplicate ids
    finally:
        d.stop()


def test_malformed_queries_are_invalid_argument(
    fashion: tuple[Path, Path, np.ndarray], fashion_deployment: Deployment
) -> None:
    invalid = 3  # grpc INVALID_ARGUMENT
    stats, _, rc = fashion_deployment.search(
        fashion[1], 10, "--truncate-dim", "100", "--count", "3"
    )
    assert rc == 5 and stats["errors"] == 3 and stats["first_error_code"] == invalid
    stats, _, rc = fashion_deployment.search(fashion[1], 0, "--count", "2")
    assert rc == 5 and stats["first_error_code"] == invalid
    stats, _, rc = fashion_deployment.search(fashion[1], 5000, "--count", "2")
    assert rc == 5 and stats["first_error_code"] == invalid


def test_a_leaf_down_gives_partial_answers_not_errors(
    tmp_path: Path, fashion: tuple[Path, Path, np.ndarray]
) -> None:
    d = Deployment(tmp_path, fashion[0], shards=3, mid_args=("--leaf-timeout-ms", "300"))
    try:
        d.leaves[2].kill()
        d.leaves[2].wait()
        t0 = time.monotonic()
        stats, ids, rc = d.search(fashion[1], 10, "--count", "50")
        assert rc == 0, stats
        assert time.monotonic() - t0 < 60
        recall = datasets.recall_at_k(ids, fashion[2][:50])
        print(f"one of 3 leaves down: recall@10 {recall:.3f}")
        assert 0.3 < recall < 0.95  # the dead shard's neighbours are missing, the rest are found
        assert not (ids[ids != 0xFFFFFFFF] >= 2 * 20000 // 3).any()  # nothing from the dead shard
    finally:
        d.stop()


def test_corrupt_or_mismatched_data_is_a_clear_startup_error(
    tmp_path: Path, fashion: tuple[Path, Path, np.ndarray]
) -> None:
    raw = fashion[0].read_bytes()
    bad = tmp_path / "truncated.bin"
    bad.write_bytes(raw[: len(raw) - 10])
    with pytest.raises(RuntimeError, match="truncated"):
        servers.start([str(BIN / "hdsearch_leaf"), "--data", str(bad)], tmp_path / "bad.port")
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"not a vector file at all, not at all")
    with pytest.raises(RuntimeError, match="magic"):
        servers.start(
            [str(BIN / "hdsearch_leaf"), "--data", str(garbage)], tmp_path / "garbage.port"
        )
    # A mid-tier built on other data than its leaves refuses to start.
    other = tmp_path / "other.bin"
    datasets.write_synthetic_vectors(other, 1000, 784, seed=1, clusters=8)
    leaf, port = servers.start(
        [str(BIN / "hdsearch_leaf"), "--data", str(fashion[0])], tmp_path / "l.port"
    )
    try:
        with pytest.raises(RuntimeError, match="expected shard"):
            servers.start(
                [
                    str(BIN / "hdsearch_midtier"),
                    "--data",
                    str(other),
                    "--leaves",
                    f"127.0.0.1:{port}",
                ],
                tmp_path / "m.port",
            )
    finally:
        servers.stop(leaf)


def test_vector_files_round_trip_and_reject_corruption(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    datasets.write_vectors(tmp_path / "v.bin", a)
    assert np.array_equal(datasets.read_vectors(tmp_path / "v.bin"), a)
    raw = (tmp_path / "v.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(raw[:-1])
    with pytest.raises(InputError, match="truncated"):
        datasets.read_vectors(tmp_path / "cut.bin")
    (tmp_path / "bad.bin").write_bytes(b"XXXXXXXX" + raw[8:])
    with pytest.raises(InputError, match="magic"):
        datasets.read_vectors(tmp_path / "bad.bin")
    with pytest.raises(InputError):
        datasets.write_vectors(tmp_path / "nan.bin", np.array([[np.nan, 1.0]]))


def test_synthetic_vectors_are_seeded_and_streamed(tmp_path: Path) -> None:
    datasets.write_synthetic_vectors(tmp_path / "a.bin", 5000, 64, seed=9, clusters=16)
    datasets.write_synthetic_vectors(tmp_path / "b.bin", 5000, 64, seed=9, clusters=16)
    datasets.write_synthetic_vectors(tmp_path / "c.bin", 5000, 64, seed=10, clusters=16)
    a, b, c = (datasets.read_vectors(tmp_path / f"{n}.bin") for n in "abc")
    assert a.shape == (5000, 64)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # chunked generation: rows after the first chunk are not copies of the first chunk
    chunks = list(datasets.synthetic_vector_chunks(40000, 8, seed=1, chunk=16384))
    assert [len(x) for x in chunks] == [16384, 16384, 7232]
    # clustered: a query's nearest neighbour is much closer than a random point
    q = datasets.synthetic_queries(20, 64, seed=9, clusters=16)
    nn = datasets.brute_force_knn(a, q, 1)[:, 0]
    d_nn = np.linalg.norm(a[nn] - q, axis=1)
    d_rand = np.linalg.norm(a[:20] - q, axis=1)
    assert np.median(d_nn) < 0.5 * np.median(d_rand)


def test_brute_force_and_recall_helpers() -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(size=(300, 5)).astype(np.float32)
    q = data[:10] + 1e-4
    truth = datasets.brute_force_knn(data, q, 3)
    assert (truth[:, 0] == np.arange(10)).all()
    assert datasets.recall_at_k(truth, truth) == 1.0
    assert datasets.recall_at_k(np.full_like(truth, 0xFFFFFFFF), truth) == 0.0


def test_lsh_bench_measures_recall_and_refuses_bad_flags(tmp_path: Path) -> None:
    """bench/hdsearch_lsh.py's C++ driver: its recall is the candidates' recall against brute
    force (computed in the driver); bad input is a one-line error and exit 2 (flags) or 1
    (data)."""
    exe = BIN / "hdsearch_lsh_bench"
    if not exe.exists():
        pytest.skip(f"{exe} not built (run scripts/build-services)")
    datasets.write_synthetic_vectors(tmp_path / "d.bin", 4000, 32, seed=5, clusters=32)
    datasets.write_vectors(
        tmp_path / "q.bin", datasets.synthetic_queries(50, 32, seed=5, clusters=32)
    )
    base = [str(exe), "--data", str(tmp_path / "d.bin"), "--queries", str(tmp_path / "q.bin")]
    figures = {}
    for probes in (0, 32):
        out = subprocess.run([*base, "--probes", str(probes), "--rounds", "1", "--cold-mb", "1"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0, out.stderr
        figures[probes] = json.loads(out.stdout)
    assert figures[32]["recall"] >= 0.93
    assert figures[32]["mean_candidates"] > figures[0]["mean_candidates"]
    assert figures[32]["recall"] >= figures[0]["recall"]
    assert 0 < figures[32]["mean_candidates"] < 4000
    for argv, rc, words in (
        ([*base, "--probes", "many"], 2, "non-negative integer"),
        ([*base, "--bogus", "1"], 2, "unknown flag --bogus"),
        ([str(exe), "--data", str(tmp_path / "d.bin")], 2, "--queries are required"),
        ([*base[:3], "--queries", str(tmp_path / "nope.bin")], 1, "nope.bin"),
    ):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert out.returncode == rc, (argv, out.stderr)
        assert words in out.stderr and out.stderr.count("\n") == 1, out.stderr
    out = subprocess.run([sys.executable, str(REPO / "bench" / "hdsearch_lsh.py"), "--sets", "nope"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 3 and "unknown data set(s) nope" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
