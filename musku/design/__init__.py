"""Multi-arm crossover designs (issue 20, item 2): a knob's K settings and the baseline run
as one experiment on a group of hosts.

- :mod:`musku.design.williams`: the balanced rotation (a Williams square, two squares for an
  odd number of arms): every host runs every arm in turn, host bias and period effects cancel.
- :mod:`musku.design.sequential`: always-valid confidence sequences on every pairwise contrast
  (Bonferroni over the family), successive elimination and the stopping rules.
- :mod:`musku.design.group`: the multi-arm scan on a group of hosts (the group's interface is
  :mod:`musku.hosts.group`, the simulated group :mod:`musku.sim.group`): the rotation with
  warm-up discard per switch, feeding the procedure.

- :mod:`musku.design.fleet`: a knob's scans on groups of a fleet (``[sweep] mode =
  "multiarm"``, musku.sweep.multiarm); every arm is checked against the guardrails at every
  look.
- :mod:`musku.design.advice`: which mode, pairwise or multiarm, is expected faster for a pool
  (``musku check``, ``musku sweep --dry-run``).
"""
