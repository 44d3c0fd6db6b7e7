"""The schema layer: every input file musku reads, declared as typed (pydantic v2) models.

- :mod:`musku.schema.document`: reading a TOML file within the input limits
  (:mod:`musku.inputfiles`), validating it against a model and wording the first error as
  musku's one-line ``file:line: message``;
- :mod:`musku.schema.tomlpos`: line numbers of TOML keys, for errors inside arrays of tables;
- the models: :mod:`~musku.schema.experiment` (experiment files, platform catalogs),
  :mod:`~musku.schema.simmodel`, :mod:`~musku.schema.agentconfig`, :mod:`~musku.schema.hosts`
  (each backend's ``[hosts]`` options) and ``musku.qsim.model.QsimModel``.

:data:`KINDS` names each kind for ``musku schema KIND``, which prints its JSON Schema, so that
editors (taplo / Even Better TOML) complete and check the files.
"""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel

from musku.registry import BACKENDS

KINDS: dict[str, str] = {
    "experiment": "musku.schema.experiment:ExperimentFile",
    "catalog": "musku.schema.experiment:CatalogFile",
    "sim-model": "musku.schema.simmodel:SimModelFile",
    "agent-config": "musku.schema.agentconfig:AgentConfigFile",
    "qsim-model": "musku.qsim.model:QsimModel",
}
"""File kind -> ``module:Model``: imported when asked for (``musku.qsim.model`` imports this
package for its line numbers). Each registered host backend adds ``hosts-NAME``, its
``[hosts]`` options model (``Backend.options``, :func:`kinds`)."""

HOSTS = "hosts-"


def kinds() -> list[str]:
    """Every kind ``musku schema`` knows: the file kinds, then ``hosts-NAME`` per registered
    backend that declares its options (loads the backends)."""
    hosts = [f"{HOSTS}{n}" for n in BACKENDS.names() if BACKENDS.get(n).options is not None]
    return [*KINDS, *hosts]


DIALECT = "https://json-schema.org/draft/2020-12/schema"


def model_of(kind: str) -> type[BaseModel]:
    """The model of input-file kind ``kind`` (one of :func:`kinds`)."""
    if kind.startswith(HOSTS) and kind not in KINDS:
        model = BACKENDS.get(kind.removeprefix(HOSTS)).options
    else:
        module, _, name = KINDS[kind].partition(":")
        model = getattr(importlib.import_module(module), name)
    assert isinstance(model, type) and issubclass(model, BaseModel)
    return model


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of input-file kind ``kind``. An experiment's
    ``[hosts]`` is one of the registered backends' option tables, or a ``module:attr``
    backend's own."""
    schema = model_of(kind).model_json_schema()
    if kind == "experiment":
        defs = schema.setdefault("$defs", {})
        choices: list[dict[str, Any]] = []
        for backend in [k.removeprefix(HOSTS) for k in kinds() if k.startswith(HOSTS)]:
            sub = model_of(f"{HOSTS}{backend}").model_json_schema()
            defs.update(sub.pop("$defs", {}))
            title = sub.get("title", backend)
            defs[title] = sub
            choices.append({"$ref": f"#/$defs/{title}"})
        generic = defs.get("HostsTable", {})
        other = {**generic, "properties": {"backend": {"type": "string", "pattern": ":"}}}
        choices.append(other)
        schema["properties"]["hosts"] = {"anyOf": choices, "description": "[hosts]"}
    return {"$schema": DIALECT, **schema}
