"""The store's protocols, its repositories and the Store façade agree (issue 33): every
protocol method is on its repository and on the façade with the same parameters, and the
façade has no public method outside a protocol. mypy checks the types
(``musku/storage/store.py``'s ``_implements``); this checks what mypy does not see: a method
added to a repository but left out of its protocol or of the façade."""

from __future__ import annotations

import inspect

import pytest

from musku.storage import protocols
from musku.storage.calibrations import Calibrations
from musku.storage.claims import Claims
from musku.storage.comparisons import Comparisons
from musku.storage.deployments import Deployments
from musku.storage.queue import Queue
from musku.storage.runs import Runs
from musku.storage.samples import Samples
from musku.storage.skus import SoftSkus
from musku.storage.store import Store
from musku.storage.tables import ThreadingTables

PAIRS: list[tuple[type, type]] = [
    (protocols.RunStore, Runs),
    (protocols.ClaimStore, Claims),
    (protocols.ComparisonStore, Comparisons),
    (protocols.SampleStore, Samples),
    (protocols.QueueStore, Queue),
    (protocols.SkuStore, SoftSkus),
    (protocols.TableStore, ThreadingTables),
    (protocols.CalibrationStore, Calibrations),
    (protocols.DeploymentStore, Deployments),
]


def members(cls: type) -> set[str]:
    """Public names ``cls`` defines itself (not inherited)."""
    return {n for n in vars(cls) if not n.startswith("_")}


def params(obj: object) -> list[tuple[str, object, object]]:
    fn = obj.fget if isinstance(obj, property) else obj
    assert callable(fn)
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(("protocol", "repo"), PAIRS, ids=[p.__name__ for p, _ in PAIRS])
def test_repository_implements_its_protocol(protocol: type, repo: type) -> None:
    assert members(protocol) == members(repo)
    for name in members(protocol):
        assert params(vars(protocol)[name]) == params(vars(repo)[name]), name
        assert params(vars(protocol)[name]) == params(vars(Store)[name]), name


def test_facade_has_nothing_outside_the_protocols() -> None:
    offered = set().union(*(members(p) for p, _ in PAIRS)) | members(protocols.ResultStore)
    facade = {n for n in dir(Store) if not n.startswith("_")} - {"engine", "dialect"}
    assert facade == offered
    assert len(offered) == sum(len(members(p)) for p, _ in PAIRS) + 2  # no name in two concerns
