// Threading tables are validated against the JSON Schema exported from musku's pydantic model
// (musku/schema/threadingtable.py -> services/framework/schema/threading-table.schema.json, the
// one source of truth), embedded at build time. A validator of the keywords that schema uses:
// type, const, enum, required, properties, additionalProperties, items, minItems, minLength,
// minimum, maximum, $ref to #/$defs/..., and musku's x-increasing (the named field of an
// array's items strictly increases). An unknown keyword in the schema is an error, so a new
// rule in the model cannot be silently skipped here.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace musku::detail {

// The embedded threading-table schema (parsed once).
const nlohmann::json& ThreadingTableSchema();

// "" when `doc` satisfies `schema`; else "where: why" (e.g. "rows[1].workers: must be an
// integer") for the first violation.
std::string ValidateSchema(const nlohmann::json& doc, const nlohmann::json& schema);

}  // namespace musku::detail
