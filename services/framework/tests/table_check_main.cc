// threading_table_check PATH SERVICE [unary|batch]: load a threading table as the mid-tier's
// --threading-table does (schema, service, CPU count, transport, pool sizes) and print "ok" or
// the reason; exit 0 or 3.
#include <cstdio>
#include <string>

#include "auto_policy.h"

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: threading_table_check PATH SERVICE [unary|batch]\n");
    return 2;
  }
  const std::string transport = argc == 4 ? argv[3] : "unary";
  musku::PoolSizes max{4096, 4096, 4096};  // the schema's MAX_POOL: no host maxima here
  musku::detail::DecisionTable table;
  const std::string why = musku::detail::LoadDecisionTable(
      argv[1], argv[2], max, &table,
      transport == "batch" ? musku::LeafTransport::kBatch : musku::LeafTransport::kUnary);
  std::printf("%s\n", why.empty() ? "ok" : why.c_str());
  return why.empty() ? 0 : 3;
}
