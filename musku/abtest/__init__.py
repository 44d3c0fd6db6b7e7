"""The sequential paired A/B tester: crossover periods, data-driven warm-up, batch means and
an anytime-valid decision rule (see :mod:`musku.abtest.driver` and :mod:`musku.abtest.rules`).

Usage (the sweep)::

    from musku.abtest import run_comparison
    result = run_comparison(pair, baseline, candidate, spec, on_window=..., should_stop=...)
"""

from musku.abtest.driver import Progress, run_comparison, validate_spec
from musku.abtest.rules import RULES, DecisionRule, Evidence, RuleSetup, Verdict, make_rule

__all__ = [
    "RULES",
    "DecisionRule",
    "Evidence",
    "Progress",
    "RuleSetup",
    "Verdict",
    "make_rule",
    "run_comparison",
    "validate_spec",
]
