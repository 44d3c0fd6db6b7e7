"""Fake-kernel rules of the built-in knobs, one module per knob.

Each knob's spec names its rules (``KnobSpec.fake_kernel = "musku.testing.kernel.thp:RULES"``,
a sequence of :class:`musku.testing.fakehost.KernelRule`); the fake kernel
(:class:`~musku.testing.fakehost.FakeKernelFS`) applies the rules of every registered knob, so
an out-of-tree knob brings its own the same way (``tests/knobs/toyknob.py``).
"""
