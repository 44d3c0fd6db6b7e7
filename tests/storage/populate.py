"""A small, realistic results database built through the Store API: two platforms, a knob
sweep per platform with every kind of decision, samples with warm-up and invalid windows,
soft SKUs with validations, threading tables. Used by the query tests (and handy by hand:
``python -m tests.storage.populate sqlite:////tmp/demo.db``)."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

import numpy as np

from musku.domain import ComparisonResult, Configuration, Decision, ExperimentStatus, SoftSku
from musku.experiment import Experiment
from musku.storage.store import Store

# (knob, setting, decision, effect) per platform; effect = true relative gain of B over A
PLAN: dict[str, list[tuple[str, object, Decision, float]]] = {
    "skylake18": [
        ("cdp", "6:5", Decision.BETTER, 0.042),
        ("cdp", "9:2", Decision.WORSE, -0.031),
        ("thp", "never", Decision.NO_DIFFERENCE, 0.001),
        ("prefetch", "dcu", Decision.BETTER, 0.018),
        ("prefetch", "all_off", Decision.GUARDRAIL, -0.09),
        ("core_freq", 2.0, Decision.INCONCLUSIVE, 0.002),
    ],
    "broadwell16": [
        ("cdp", "6:5", Decision.BETTER, 0.027),
        ("cdp", "9:2", Decision.BETTER, 0.012),
        ("thp", "never", Decision.INCONCLUSIVE, -0.001),
        ("prefetch", "dcu", Decision.WORSE, -0.015),
    ],
}

# a sweep's run-offs and confirmations (purpose knob:<knob>:<step>): they compare settings with
# each other, not with the baseline, so best_setting_per_knob.sql must ignore them. Their
# estimates beat every knob:<knob> row, so a query that counted them would answer wrongly.
# (platform, purpose, knob, baseline setting, candidate setting, decision, effect)
STEPS: list[tuple[str, str, str, object, object, Decision, float]] = [
    ("skylake18", "knob:cdp:runoff", "cdp", "9:2", "6:5", Decision.BETTER, 0.071),
    ("skylake18", "knob:cdp:confirm", "cdp", "off", "6:5", Decision.BETTER, 0.065),
    ("broadwell16", "knob:thp:confirm", "thp", "madvise", "never", Decision.BETTER, 0.052),
]


@dataclass
class Populated:
    experiments: dict[str, int] = field(default_factory=dict)  # platform -> id
    comparisons: dict[tuple[str, str, str], int] = field(default_factory=dict)
    results: dict[int, ComparisonResult] = field(default_factory=dict)
    softskus: dict[str, int] = field(default_factory=dict)
    samples_per_host: int = 0
    failed_experiment: int = 0  # a crashed run that had saved a soft SKU already
    failed_softsku: int = 0


def _samples(
    rng: np.random.Generator, n: int, effect: float, warmup: int
) -> list[dict[str, object]]:
    load = 1000.0 * (1.0 + 0.2 * np.sin(np.arange(n) / 15.0))  # shared live load
    rows: list[dict[str, object]] = []
    for host, role, gain in ((0, "A", 0.0), (1, "B", effect)):
        mips = load * (1.0 + gain) * (1.0 + rng.normal(0.0, 0.01, n))
        p99 = 8.0 + rng.gamma(2.0, 0.5, n)
        for i in range(n):
            rows.append(
                {
                    "seq": i,
                    "t": 60.0 * (i + 1),
                    "host": host,
                    "role": role,
                    "period": i // 20,
                    "warmup": i < warmup,
                    "valid": i % 37 != 36,
                    "metrics": {
                        "mips": float(mips[i]),
                        "qps": float(load[i] * 2.0),
                        "p99_ms": float(p99[i]),
                        "qos_violation_rate": float(p99[i] > 12.0),
                        "power_w": float(180.0 + 20.0 * gain + rng.normal(0.0, 2.0)),
                        "llc_mpki": float(rng.uniform(1.0, 3.0)),
                    },
                }
            )
    return rows


def populate(store: Store, experiment: Experiment, *, samples_per_host: int = 60) -> Populated:
    rng = np.random.default_rng(20261121)
    out = Populated(samples_per_host=samples_per_host)
    for platform, plan in PLAN.items():
        exp = dataclasses.replace(
            experiment,
            name=f"web-{platform}",
            platform=dataclasses.replace(experiment.platform, name=platform),
        )
        exp_id = store.create_experiment(exp)
        out.experiments[platform] = exp_id
        store.set_status(exp_id, ExperimentStatus.RUNNING)
        store.add_hosts(exp_id, {"hosts": [f"{platform}-a", f"{platform}-b"], "kernel": "6.1"})
        base = exp.production
        best: dict[str, Configuration] = {}
        for knob, setting, decision, effect in plan:
            cand = base.with_(knob, setting)
            cmp_id = store.start_comparison(exp_id, f"knob:{knob}", base, cand)
            store.add_samples(cmp_id, _samples(rng, samples_per_host, effect, warmup=5))
            n = samples_per_host - 5
            half = 0.004 if decision is not Decision.INCONCLUSIVE else 0.011
            result = ComparisonResult(
                baseline=base,
                candidate=cand,
                decision=decision,
                estimate=effect,
                ci_low=effect - half,
                ci_high=effect + half,
                samples=n,
                host_time_s=60.0 * samples_per_host + (600.0 if knob == "core_count" else 0.0),
                reason=f"{decision.value} after {n} windows",
                guardrail_values={"p99_ms": 13.5 if decision is Decision.GUARDRAIL else 9.1},
                method="sequential-t",
            )
            store.finish_comparison(cmp_id, result)
            out.comparisons[(platform, knob, str(setting))] = cmp_id
            out.results[cmp_id] = result
            if decision is Decision.BETTER:  # PLAN lists a knob's best setting first
                best.setdefault(knob, cand)
        for plat, purpose, knob, a, b, decision, effect in STEPS:
            if plat != platform:
                continue
            ref, cand = base.with_(knob, a), base.with_(knob, b)
            cmp_id = store.start_comparison(exp_id, purpose, ref, cand)
            store.add_samples(cmp_id, _samples(rng, samples_per_host, effect, warmup=5))
            n = samples_per_host - 5
            result = ComparisonResult(
                baseline=ref,
                candidate=cand,
                decision=decision,
                estimate=effect,
                ci_low=effect - 0.004,
                ci_high=effect + 0.004,
                samples=n,
                host_time_s=60.0 * samples_per_host,
                reason=f"{decision.value} after {n} windows",
                method="sequential-t",
            )
            store.finish_comparison(cmp_id, result)
            out.results[cmp_id] = result
        sku_config = base
        for knob, cand in best.items():
            sku_config = sku_config.with_(knob, cand[knob])
        validations: dict[str, ComparisonResult] = {}
        for against, ref, gain in (("production", base, 0.05), ("stock", exp.stock, 0.07)):
            cmp_id = store.start_comparison(exp_id, f"validate:{against}", ref, sku_config)
            store.add_samples(cmp_id, _samples(rng, samples_per_host, gain, warmup=5))
            result = ComparisonResult(
                baseline=ref,
                candidate=sku_config,
                decision=Decision.BETTER,
                estimate=gain,
                ci_low=gain - 0.01,
                ci_high=gain + 0.01,
                samples=samples_per_host - 5,
                host_time_s=60.0 * samples_per_host,
                reason="validated",
                method="sequential-t",
            )
            store.finish_comparison(cmp_id, result)
            out.results[cmp_id] = result
            validations[against] = result
        out.softskus[platform] = store.save_softsku(
            exp_id,
            SoftSku(
                "web",
                platform,
                sku_config,
                vs_production=validations["production"],
                vs_stock=validations["stock"],
            ),
        )
        store.set_status(exp_id, ExperimentStatus.DONE)
        store.save_threading_table(
            "web", f"{platform}-a", platform, sku_config, {"1000": "tp8", "8000": "tmp16"}
        )
    _failed_run(store, experiment, out, rng)
    return out


def _failed_run(
    store: Store, experiment: Experiment, out: Populated, rng: np.random.Generator
) -> None:
    """A newer Skylake run that saved a soft SKU and then failed: softsku_gains.sql must keep
    reporting the done run's soft SKU."""
    exp = dataclasses.replace(experiment, name="web-skylake18-crashed")
    exp_id = store.create_experiment(exp)
    store.set_status(exp_id, ExperimentStatus.RUNNING)
    base = exp.production
    cand = base.with_("thp", "never")
    cmp_id = store.start_comparison(exp_id, "validate:production", base, cand)
    store.add_samples(cmp_id, _samples(rng, out.samples_per_host, 0.2, warmup=5))
    result = ComparisonResult(
        baseline=base,
        candidate=cand,
        decision=Decision.BETTER,
        estimate=0.2,
        ci_low=0.19,
        ci_high=0.21,
        samples=10,
        host_time_s=10.0,
        reason="validated",
        method="sequential-t",
    )
    store.finish_comparison(cmp_id, result)
    out.results[cmp_id] = result
    out.failed_softsku = store.save_softsku(
        exp_id, SoftSku("web", exp.platform.name, cand, vs_production=result)
    )
    store.set_status(exp_id, ExperimentStatus.FAILED)
    out.failed_experiment = exp_id


def main(argv: list[str]) -> int:
    from musku.experiment import load_experiment
    from musku.storage import open_store
    from musku.testing.storage import EXPERIMENT

    with open_store(argv[0]) as store:
        populate(store, load_experiment(EXPERIMENT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
