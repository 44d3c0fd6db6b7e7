"""End-to-end tests of Set Algebra and the threading framework over gRPC (real processes).

Needs the built services (scripts/build-services); skipped cleanly when they are absent.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from musku.errors import HostError, InputError
from musku.services import datasets, runtime
from tests.services import servers

pytestmark = pytest.mark.services

servers.skip_unless_built(*servers.SETALGEBRA, "setalgebra_client")

SMALL = {"docs": 20_000, "terms": 500, "queries": 300, "seed": 3}


def read_index(path: Path) -> dict[str, list[int]]:
    """Independent Python reader of the MSAIDX01 format (the reference side of the test)."""
    data = path.read_bytes()
    assert data[:8] == b"MSAIDX01"
    _docs, nterms = struct.unpack_from("<II", data, 8)
    off = 16
    out = {}
    for _ in range(nterms):
        (ln,) = struct.unpack_from("<H", data, off)
        off += 2
        term = data[off : off + ln].decode()
        off += ln
        (c,) = struct.unpack_from("<I", data, off)
        off += 4
        out[term] = list(struct.unpack_from(f"<{c}I", data, off))
        off += 4 * c
    return out


def reference(index: dict[str, list[int]], terms: list[str]) -> list[int]:
    acc: set[int] | None = None
    for t in terms:
        docs = set(index.get(t, []))
        acc = docs if acc is None else acc & docs
    return sorted(acc or set())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sa-data")


@pytest.fixture(scope="module")
def deployment(data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    with runtime.deploy(
        "setalgebra",
        workdir=tmp_path_factory.mktemp("sa-run"),
        data_dir=data_dir,
        shards=2,
        data_opts=SMALL,
        leaf_timeout_ms=500,
    ) as dep:
        yield dep


def client(address: str, *args: str) -> list[dict]:
    cp = subprocess.run(
        [str(runtime.binary("setalgebra_client")), "--target", address, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    return [json.loads(line) for line in cp.stdout.splitlines()]


def test_midtier_answers_equal_the_reference(deployment: runtime.Deployment) -> None:
    index = read_index(deployment.extra["index"])
    queries = deployment.load_data.read_text().splitlines()
    answers = client(deployment.midtier.address, "--queries", str(deployment.load_data))
    assert len(answers) == len(queries)
    nonempty = 0
    for q, a in zip(queries, answers, strict=True):
        assert a["code"] == 0, a
        want = reference(index, q.split())
        assert a["docs"] == want, q
        nonempty += bool(want)
    assert nonempty > 20  # not a trivially empty workload


@pytest.mark.parametrize("model", ["async-inline-block", "sync-dispatch-block"])
def test_batch_transport_answers_equal_the_reference_under_concurrency(
    data_dir: Path, tmp_path: Path, model: str
) -> None:
    """Eight clients at once, so leaf calls of different queries share stream messages: every
    answer must still be its own query's."""
    with runtime.deploy(
        "setalgebra",
        workdir=tmp_path,
        data_dir=data_dir,
        data_opts=SMALL,
        threading=model,
        workers=2,
        leaf_transport="batch",
    ) as dep:
        index = read_index(dep.extra["index"])
        queries = dep.load_data.read_text().splitlines()
        argv = [str(runtime.binary("setalgebra_client")), "--target", dep.midtier.address,
                "--queries", str(dep.load_data)]  # fmt: skip
        procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(8)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0] * 8
        want = [reference(index, q.split()) for q in queries]
        for out in outs:
            answers = [json.loads(line) for line in out.splitlines()]
            assert [a["code"] for a in answers] == [0] * len(queries)
            assert [a["docs"] for a in answers] == want
        stats = runtime.admin(dep.leaves[0].address, "stats")
        assert int(stats["requests"]) >= 8 * len(queries)  # served over its stream


def test_unknown_terms_give_empty_and_malformed_give_invalid_argument(
    deployment: runtime.Deployment,
) -> None:
    (a,) = client(deployment.midtier.address, "--query", "wa zzz-not-a-term")
    assert a == {"line": 0, "code": 0, "docs": []}
    (b,) = client(deployment.midtier.address, "--query", "")
    assert b["code"] == 3  # INVALID_ARGUMENT: a query needs a term


@pytest.mark.parametrize("model", runtime.THREADING_MODELS)
def test_every_model_answers_under_load(deployment: runtime.Deployment, model: str) -> None:
    state = runtime.set_threading(deployment.midtier.address, model, workers=1, responders=1)
    assert state["model"] == model
    res = runtime.run_load(
        deployment.midtier.address,
        "setalgebra",
        deployment.load_data,
        runtime.LoadSpec(qps=200, duration_s=1.0, warmup_s=0.2),
    )
    t = res["total"]
    assert t["errors"] == 0
    assert t["ok"] > 100
    assert t["latency_us"]["p99"] >= t["latency_us"]["p50"] > 0


def test_control_rejects_bad_requests_and_keeps_the_model(deployment: runtime.Deployment) -> None:
    addr = deployment.midtier.address
    runtime.set_threading(addr, "async-dispatch-block", pollers=1, workers=2, responders=1)
    with pytest.raises(InputError, match="unknown threading model"):
        runtime.set_threading(addr, "turbo-mode")
    with pytest.raises(InputError, match="at least 1 worker"):
        runtime.set_threading(addr, "sync-dispatch-block", workers=0)
    with pytest.raises(InputError, match="pollers"):
        runtime.set_threading(addr, "sync-inline-block", pollers=1000)
    state = runtime.admin(addr, "get")
    assert (state["model"], state["workers"]) == ("async-dispatch-block", 2)


def test_stats_count_requests(deployment: runtime.Deployment) -> None:
    runtime.admin(deployment.midtier.address, "stats", "--reset")
    client(deployment.midtier.address, "--queries", str(deployment.load_data))
    s = deployment.stats(reset=True)
    assert int(s["requests"]) == len(deployment.load_data.read_text().splitlines())
    assert int(s["errors"]) == 0
    assert s["latency"]["p99_us"] >= s["latency"]["p50_us"] > 0
    assert s["cpu_user_s"] + s["cpu_sys_s"] > 0


def test_open_loop_generator_reaches_the_offered_rate(deployment: runtime.Deployment) -> None:
    res = runtime.run_load(
        deployment.midtier.address,
        "setalgebra",
        deployment.load_data,
        runtime.LoadSpec(schedule="100:1,400:1", warmup_s=0.3),
    )
    p1, p2 = res["phases"]
    assert p1["errors"] == p2["errors"] == 0
    # Poisson counts: 100 +- 30, 400 +- 60 with a wide margin
    assert 60 <= p1["ok"] <= 140
    assert 300 <= p2["ok"] <= 500
    # every measured send's lag behind its intended time, itself inside the latencies
    lag = res["send_lag_us"]
    assert 0 <= lag["p50"] <= lag["p99"] <= lag["max"]
    assert lag["p50"] < 2000  # a sleeping sender wakes in time at 400 QPS
    assert lag["p99"] <= res["total"]["latency_us"]["p99"] + 1


def test_corrupt_index_is_a_clear_message(tmp_path: Path, data_dir: Path) -> None:
    index, _ = runtime.setalgebra_data(data_dir, **SMALL)
    bad = tmp_path / "bad.msai"
    bad.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    with pytest.raises(HostError, match="truncated or corrupt"):
        runtime.start_server(
            "badleaf",
            [str(runtime.binary("setalgebra_leaf")), "--index", str(bad)],
            tmp_path,
            timeout=20,
        )


@pytest.mark.parametrize("transport", runtime.LEAF_TRANSPORTS)
def test_leaf_down_gives_an_error_not_a_hang(
    data_dir: Path, tmp_path: Path, transport: str
) -> None:
    with runtime.deploy(
        "setalgebra",
        workdir=tmp_path,
        data_dir=data_dir,
        data_opts=SMALL,
        leaf_timeout_ms=300,
        leaf_transport=transport,
    ) as dep:
        dep.leaves[1].stop()
        t0 = time.monotonic()
        (a,) = client(dep.midtier.address, "--query", "wa wb", "--timeout-ms", "10000")
        assert a["code"] in (4, 14)  # DEADLINE_EXCEEDED or UNAVAILABLE, from the mid-tier
        assert dep.leaves[1].address in a["error"]
        assert time.monotonic() - t0 < 5


def test_sigterm_is_an_orderly_shutdown(data_dir: Path, tmp_path: Path) -> None:
    with runtime.deploy("setalgebra", workdir=tmp_path, data_dir=data_dir, data_opts=SMALL) as dep:
        pid = dep.midtier.pid
        os.kill(pid, signal.SIGTERM)
        assert dep.midtier.popen.wait(10) == 0
        assert "stopped" in dep.midtier.log_tail()


# ---- μSuite's text format: the same data for musku and the original --------------------------


def test_musuite_text_converts_exactly_to_musku_index(tmp_path: Path) -> None:
    """Text -> MSAIDX01 keeps every word's docs; the C++ reader accepts our checksum."""
    text = tmp_path / "postings.txt"
    text.write_text("7 1 5 9\n\n12 0 9 4000000000\n3\n", encoding="ascii")
    msai = tmp_path / "index.msai"
    assert datasets.postings_text_to_msai(text, msai) == 3
    assert read_index(msai) == {"7": [1, 5, 9], "12": [0, 9, 4000000000], "3": []}
    num_docs, back = datasets.read_msai(msai)
    assert num_docs == 4000000001
    assert {w: d.tolist() for w, d in back.items()} == read_index(msai)
    cp = subprocess.run(
        [str(runtime.binary("setalgebra_gen")), "check", "--index", str(msai)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout) == {"docs": 4000000001, "terms": 3}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1 3 2\n", "not strictly ascending"),
        ("1 3 3\n", "not strictly ascending"),
        ("1 2\n1 5\n", "appears twice"),
        ("1 2 x\n", "must be integers"),
        ("1 -4\n", r"\[0, 2\^32\)"),
        ("1 4294967296\n", r"\[0, 2\^32\)"),
    ],
)
def test_bad_posting_text_is_refused_with_its_line(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "p.txt"
    path.write_text("9 1 2\n" + text, encoding="ascii")
    with pytest.raises(InputError, match=why) as e:
        datasets.read_postings_text(path)
    last = len(path.read_text().splitlines())  # each bad text's last line is the bad one
    assert e.value.where == f"{path}:{last}"


def test_corrupt_msai_is_refused(tmp_path: Path) -> None:
    msai = tmp_path / "i.msai"
    datasets.write_msai(msai, {"1": [1, 2, 3]})
    data = bytearray(msai.read_bytes())
    data[20] ^= 1
    msai.write_bytes(bytes(data))
    with pytest.raises(InputError, match="checksum"):
        datasets.read_msai(msai)


def test_shards_partition_the_documents() -> None:
    import numpy as np

    post = {"1": np.array([0, 1, 2, 3, 7], dtype=np.uint32), "2": np.array([4], dtype=np.uint32)}
    s0 = datasets.shard_postings(post, 0, 2)
    s1 = datasets.shard_postings(post, 1, 2)
    assert {w: d.tolist() for w, d in s0.items()} == {"1": [0, 2], "2": [4]}
    assert {w: d.tolist() for w, d in s1.items()} == {"1": [1, 3, 7]}  # "2" has none here
    with pytest.raises(InputError, match="bad shard"):
        datasets.shard_postings(post, 2, 2)


def test_union_requests_encode_the_queries_for_the_original(tmp_path: Path) -> None:
    pytest.importorskip("google.protobuf")
    queries = tmp_path / "q.txt"
    queries.write_text("3 17\n\n4294967295 1 2\n", encoding="ascii")
    out = tmp_path / "req.bin"
    assert datasets.write_union_requests(queries, out) == 2
    data = out.read_bytes()
    req_cls, _ = datasets.musuite_messages()
    msgs, off = [], 0
    while off < len(data):
        (n,) = struct.unpack_from("<I", data, off)
        msgs.append(req_cls.FromString(data[off + 4 : off + 4 + n]))
        off += 4 + n
    assert [(list(m.word_ids), m.request_id) for m in msgs] == [([3, 17], 0),
                                                                ([4294967295, 1, 2], 1)]  # fmt: skip
    queries.write_text("3 fish\n", encoding="ascii")
    with pytest.raises(InputError, match="integer word ids"):
        datasets.write_union_requests(queries, out)


def test_synthetic_data_has_the_issue_shape() -> None:
    post, qs = datasets.synthetic_setalgebra(docs=100_000, terms=2_000, queries=500, seed=5)
    assert len(post) == 2_000 and len(qs) == 500
    sizes = [post[str(r)].size for r in (1, 10, 100, 2000)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > 9_000  # Zipf-like frequencies
    assert all(int(d.max()) < 100_000 for d in post.values() if d.size)
    assert all(2 <= len(q) <= 5 and len(set(q)) == len(q) for q in qs)
    again, qs2 = datasets.synthetic_setalgebra(docs=100_000, terms=2_000, queries=500, seed=5)
    assert qs2 == qs and all((again[w] == post[w]).all() for w in post)  # seeded


def test_musku_serves_the_musuite_files_exactly(tmp_path: Path) -> None:
    """The converted index, deployed as musku's Set Algebra, answers every query of the shared
    queries file with the intersection computed from the text posting lists."""
    files = datasets.setalgebra_musuite_data(tmp_path, docs=20_000, terms=400, queries=200,
                                             seed=2)  # fmt: skip
    text = {w: set(d.tolist()) for w, d in datasets.read_postings_text(files.postings).items()}
    shard_docs = [
        {w: set(d.tolist()) for w, d in datasets.read_postings_text(p).items()}
        for p in files.shards
    ]
    for w, docs in text.items():  # the original's leaf files split every word's docs exactly
        assert set().union(*(s.get(w, set()) for s in shard_docs)) == docs
    with runtime.deploy(
        "setalgebra",
        workdir=tmp_path / "run",
        data_dir=tmp_path,
        shards=2,
        data_opts={"index": files.index, "query_file": files.queries},
    ) as dep:
        answers = client(dep.midtier.address, "--queries", str(files.queries))
    queries = datasets.read_queries_text(files.queries)
    assert len(answers) == len(queries) == 200
    nonempty = 0
    for q, a in zip(queries, answers, strict=True):
        want = sorted(set.intersection(*(text.get(w, set()) for w in q)))
        assert a["docs"] == want, q
        nonempty += bool(want)
    assert nonempty > 10


@pytest.mark.slow
def test_bench_without_a_built_original_runs_musku_alone_and_says_so(tmp_path: Path) -> None:
    """bench/setalgebra.py --original DIR with nothing built in DIR: a one-line notice, musku's
    figures alone, and a line that no same-run comparison was made (exit 0)."""
    empty = tmp_path / "no-original"
    empty.mkdir()
    root = Path(__file__).resolve().parents[2]
    cp = subprocess.run(
        [sys.executable, str(root / "bench/setalgebra.py"), "--original", str(empty),
         "--data-dir", str(tmp_path / "data"), "--docs", "20000", "--terms", "300",
         "--queries", "200", "--rounds", "1", "--duration", "0.5", "--warmup", "0.2",
         "--loads", "100", "--concurrency", "2", "--leaf-transports", "batch",
         "--check-queries", "20", "--save", str(tmp_path / "out.json")],
        capture_output=True, text=True, timeout=600, cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    assert "holds no built intersection_server or mid_tier_server" in cp.stderr
    assert "No same-run comparison with the original μSuite was made" in cp.stdout
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["same_run_comparison"] is False
    assert list(out["systems"]) == ["musku async-dispatch-block/batch"]
    (rnd,) = out["systems"]["musku async-dispatch-block/batch"]["rounds"]
    assert rnd["open"]["100"]["ok"] > 0 and rnd["open"]["100"]["errors"] == 0
    assert rnd["open"]["100"]["cpu_us_per_query"] > 0
