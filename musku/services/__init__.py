"""Python side of the C++ μSuite services: build, run, bench (``musku services``)."""
