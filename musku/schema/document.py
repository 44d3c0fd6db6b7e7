"""Input documents validated against typed models, with musku's one-line ``file:line`` errors.

A :class:`Document` is a TOML file read within the limits of :mod:`musku.inputfiles` (size,
nesting, key and list lengths). :meth:`Document.validate` runs a pydantic model over (part
of) it and turns the first validation error into one :class:`~musku.errors.InputError`
whose message is the one musku has always given for that mistake, at the line of the key:

- a validator refuses with :class:`Refusal` and writes the message itself, with ``{table}``
  (``[statistics]``) and ``{at}`` (``[statistics] seed``) standing for where it is;
- pydantic's own errors (a wrong type, a missing key) are worded here the same way for every
  file kind: ``[statistics] sample_cap must be int, not 'lots'``, ``[experiment] needs
  'name'``, ``missing required table [reference]``;
- every model derives from :class:`Strict`: an unknown key is an error (worded by the model's
  ``UNKNOWN`` template), a value of the wrong type is never coerced (``"1"`` is not 1,
  ``true`` is not 1), and a table that is not a table says so.

Line numbers come from :func:`line_of` (the key inside its table, or the table's header);
a refusal may point at an exact line instead (an entry of an array of tables, found with
:class:`~musku.schema.tomlpos.Positions`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from musku.errors import InputError
from musku.inputfiles import parse_toml, read_text
from musku.schema.tomlpos import Positions

M = TypeVar("M", bound=BaseModel)

# ----------------------------------------------------------------------------- line numbers


def _header_name(stripped: str) -> str | None:
    """The table name of a ``[table]`` or ``[[table]]`` header line, else None. A plain scan:
    a regular expression here backtracked cubically on a line of ``[`` and spaces."""
    if not stripped.startswith("["):
        return None
    inner = stripped[2:] if stripped.startswith("[[") else stripped[1:]
    end = inner.find("]")
    name = inner[:end].strip() if end > 0 else ""
    return name or None


def _is_key_line(stripped: str, key: str) -> bool:
    """Whether ``stripped`` starts ``key =`` or ``"key" =``."""
    rest = stripped[1:] if stripped.startswith('"') else stripped
    if not rest.startswith(key):
        return False
    rest = rest[len(key) :]
    rest = rest[1:] if rest.startswith('"') else rest
    return rest.lstrip().startswith("=")


def line_of(text: str, key: str, table: str | None = None) -> int | None:
    """Best-effort line number of ``key = ...`` (inside ``[table]`` when given), or of the
    header of table ``key`` when no table is given, in time linear in the size of the text
    (tomllib keeps no positions)."""
    in_table = table is None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        name = _header_name(stripped)
        if name is not None:
            if table is not None:
                in_table = name == table
            if table is None and (key == name or name.endswith("." + key)):
                return number
            continue
        if in_table and _is_key_line(stripped, key):
            return number
    return None


# ----------------------------------------------------------------------------- refusals


class Refusal(ValueError):
    """A validator's refusal in musku's own words.

    ``message`` may hold ``{table}`` (``[noise.load]``) and ``{at}`` (``[noise.load]
    jitter_sigma``), filled in from where the error is. ``key`` names a key inside the
    validated table (an unknown key, say) so that the error points at its line; ``line``
    overrides the line; ``line_key``/``line_table`` look another key up instead. ``here``
    says the error is about the validated table itself (a model validator's refusal), so
    ``{table}`` is that table, not its parent.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | int | None = None,
        line: int | None = None,
        line_key: str | None = None,
        line_table: str | None = None,
        here: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.line = line
        self.line_key = line_key
        self.line_table = line_table
        self.here = here


TYPE_NAMES = {
    "int_type": "int",
    "int_from_float": "int",
    "float_type": "int or float",
    "string_type": "str",
    "bool_type": "bool",
    "list_type": "list",
    "tuple_type": "list",
}
"""How pydantic's type errors are worded (the Python type names musku's messages use)."""


def table_name(parts: tuple[str | int, ...]) -> str:
    """``("noise", "load")`` -> ``noise.load`` (list indexes are left out)."""
    return ".".join(str(p) for p in parts if isinstance(p, str))


class Strict(BaseModel):
    """Base of every input-file model: frozen, no coercion, unknown keys refused.

    ``UNKNOWN`` words an unknown key (``{table}``, ``{key}``, ``{allowed}``); ``NOT_TABLE``
    what is not a table. Subclasses override them to keep their file kind's wording.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    UNKNOWN: ClassVar[str] = "{table} has unknown key '{key}' (allowed: {allowed})"
    NOT_TABLE: ClassVar[str] = "{table} must be a table"

    @classmethod
    def shape(cls, data: dict[str, Any]) -> None:
        """Checks of the raw table that must come after the key check and before the values'
        (a message that names the whole table, a key that needs another): override it."""

    @classmethod
    def key_names(cls) -> list[str]:
        """The keys this table takes, as written in the file."""
        return sorted(f.alias or name for name, f in cls.model_fields.items())

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise Refusal(cls.NOT_TABLE, here=True)
        allowed = cls.key_names()
        for key in data:
            if key not in allowed:
                raise Refusal(
                    cls.UNKNOWN.replace("{key}", str(key)).replace("{allowed}", ", ".join(allowed)),
                    key=str(key),
                )
        cls.shape(dict(data))
        return data


# ----------------------------------------------------------------------------- documents


class Document:
    """A parsed TOML input file (or a dict standing for one) and what is needed to point at
    its lines."""

    def __init__(self, path: Path, text: str, data: dict[str, Any]) -> None:
        self.path = path
        self.source: str | None = str(path)  # what errors name (None: nothing)
        self.text = text
        self.data = data
        self._positions: Positions | None = None

    @classmethod
    def read(cls, path: str | Path) -> Document:
        """Read and parse ``path`` within the input limits (:mod:`musku.inputfiles`)."""
        p = Path(path)
        text = read_text(p)
        return cls(p, text, parse_toml(text, str(p)))

    @classmethod
    def of(cls, data: Mapping[str, Any], name: str | None) -> Document:
        """A document given as a dict (no text: errors name ``name`` only, or nothing)."""
        doc = cls(Path(name or "-"), "", dict(data))
        doc.source = name
        return doc

    @property
    def positions(self) -> Positions:
        if self._positions is None:
            self._positions = Positions(self.text)
        return self._positions

    def where(self, line: int | None) -> str | None:
        return f"{self.source}:{line}" if line and self.source else self.source

    def error(self, message: str, key: str | None = None, table: str | None = None) -> InputError:
        """An error at ``key = ...`` inside ``[table]`` (or at table ``key``'s header)."""
        line = line_of(self.text, key, table) if key and self.text else None
        return InputError(message, where=self.where(line))

    # --------------------------------------------------------------- the pydantic bridge

    def validate(
        self,
        model: type[M],
        data: Any = ...,
        *,
        prefix: tuple[str, ...] = (),
        context: Mapping[str, Any] | None = None,
    ) -> M:
        """``model`` validated over ``data`` (default: the whole document), which sits at
        ``prefix`` in the document; the first error is raised as one InputError."""
        try:
            return model.model_validate(self.data if data is ... else data, context=context)
        except ValidationError as exc:
            raise self.refuse(exc, prefix) from None

    def refuse(self, exc: ValidationError, prefix: tuple[str, ...] = ()) -> InputError:
        """The first error of ``exc`` in musku's words, at its line."""
        err = exc.errors(include_url=False)[0]
        # a dict key's own error is located at the key, not at "[key]"
        loc = prefix + tuple(p for p in err["loc"] if isinstance(p, str | int) and p != "[key]")
        cause = (err.get("ctx") or {}).get("error")
        kind = err["type"]
        here = False
        if isinstance(cause, Refusal):
            here = cause.here and cause.key is None
            if cause.key is not None:
                loc = (*loc, cause.key)
            message = cause.message
        elif kind == "missing":
            if len(loc) == 1:
                return self.error(f"missing required table [{loc[0]}]")
            message = f"{{table}} needs '{loc[-1]}'"
            cause = Refusal(message, line_key=table_name(loc[:-1]))
        elif kind in TYPE_NAMES:
            message = f"{{at}} must be {TYPE_NAMES[kind]}, not {err['input']!r}"
        elif kind in ("dict_type", "model_type", "model_attributes_type"):
            message = "{at} must be a table"
        elif kind == "extra_forbidden":
            message = "{table} has unknown key '" + str(loc[-1]) + "'"
        else:  # a constraint written as a Field(...) bound: pydantic's own words
            message = "{at} " + err["msg"].removeprefix("Value error, ")
        strs = tuple(p for p in loc if isinstance(p, str))
        if here or len(strs) < 2:
            table, at = table_name(strs), f"[{table_name(strs)}]"
        else:
            table, at = table_name(strs[:-1]), f"[{table_name(strs[:-1])}] {strs[-1]}"
        text = message.replace("{table}", f"[{table}]").replace("{at}", at)
        text = text.replace("{name}", table)
        return InputError(text, where=self.where(self._line(loc, cause)))

    def _line(self, loc: tuple[str | int, ...], cause: Any) -> int | None:
        if not self.text:
            return None
        if isinstance(cause, Refusal):
            if cause.line is not None:
                return cause.line
            if cause.line_key is not None:
                return line_of(self.text, cause.line_key, cause.line_table)
        if any(isinstance(p, int) for p in loc):  # inside an array (of tables)
            return self.positions.line(loc)
        strs = tuple(p for p in loc if isinstance(p, str))
        if not strs:
            return None
        if len(strs) == 1:
            return line_of(self.text, strs[0])
        # the key in its table, else a table of that name, else the first of its sub-tables
        # (``[knobs.thp.p99]`` with no ``[knobs.thp]`` header)
        name = table_name(strs)
        return (
            line_of(self.text, strs[-1], table_name(strs[:-1]))
            or line_of(self.text, name)
            or self._first_subtable(name)
        )

    def _first_subtable(self, name: str) -> int | None:
        for number, line in enumerate(self.text.splitlines(), start=1):
            header = _header_name(line.strip())
            if header is not None and header.startswith(name + "."):
                return number
        return None


def bounds(**schema: Any) -> Any:
    """JSON Schema keywords (``minimum``, ``maxLength``...) for a value whose range a
    validator checks in musku's words (a pydantic ``Field(ge=...)`` would word it its way)."""
    return Field(json_schema_extra=schema)


class Check:
    """Validation and JSON Schema in one ``Annotated`` item: ``func`` checks the value
    (before pydantic's own type check with ``mode="before"``, after it with ``"after"``) and
    raises a :class:`Refusal`; ``schema`` adds JSON Schema keywords (``minimum``...)."""

    def __init__(self, func: Callable[[Any], Any], mode: str = "before", **schema: Any) -> None:
        self.func = func
        self.mode = mode
        self.schema = schema

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        inner = handler(source)
        if self.mode == "before":
            return core_schema.no_info_before_validator_function(self.func, inner)
        return core_schema.no_info_after_validator_function(self.func, inner)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out.update(self.schema)
        return out
