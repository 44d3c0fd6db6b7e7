#include "logic.h"

#include <algorithm>

namespace setalgebra {

std::string ValidateTerms(const google::protobuf::RepeatedPtrField<std::string>& terms) {
  if (terms.empty()) return "a query needs at least one term";
  if (terms.size() > kMaxTerms) return "a query takes at most " + std::to_string(kMaxTerms) + " terms";
  for (const auto& t : terms) {
    if (t.empty()) return "empty term";
    if (t.size() > kMaxTermLength) return "term longer than " + std::to_string(kMaxTermLength) + " bytes";
  }
  return "";
}

void UnionSorted(const std::vector<const google::protobuf::RepeatedField<uint32_t>*>& lists,
                 google::protobuf::RepeatedField<uint32_t>* out) {
  out->Clear();
  std::vector<uint32_t> acc, tmp;
  for (const auto* l : lists) {
    tmp.clear();
    tmp.reserve(acc.size() + static_cast<size_t>(l->size()));
    std::set_union(acc.begin(), acc.end(), l->begin(), l->end(), std::back_inserter(tmp));
    acc.swap(tmp);
  }
  acc.erase(std::unique(acc.begin(), acc.end()), acc.end());
  out->Add(acc.begin(), acc.end());
}

grpc::Status LeafLogic::Handle(const LeafRequest& req, LeafReply* resp) {
  if (std::string why = ValidateTerms(req.terms()); !why.empty())
    return {grpc::StatusCode::INVALID_ARGUMENT, why};
  std::vector<std::string> terms(req.terms().begin(), req.terms().end());
  std::vector<uint32_t> docs;
  index_->Query(terms, &docs);
  resp->set_shard(static_cast<uint32_t>(shard_));
  resp->mutable_docs()->Add(docs.begin(), docs.end());
  return grpc::Status::OK;
}

grpc::Status MidLogic::Process(const QueryRequest& req, musku::FanOut<LeafRequest>* out) {
  if (std::string why = ValidateTerms(req.terms()); !why.empty())
    return {grpc::StatusCode::INVALID_ARGUMENT, why};
  if (out->num_leaves() == 0) return {grpc::StatusCode::FAILED_PRECONDITION, "no leaves configured"};
  for (int i = 0; i < out->num_leaves(); ++i) *out->To(i)->mutable_terms() = req.terms();
  return grpc::Status::OK;
}

grpc::Status MidLogic::Finalize(const QueryRequest& req,
                                std::vector<musku::LeafReply<LeafReply>>& replies,
                                QueryReply* resp) {
  std::vector<const google::protobuf::RepeatedField<uint32_t>*> lists;
  for (auto& r : replies) {
    if (!r.status.ok()) {
      const std::string where = r.leaf >= 0 && static_cast<size_t>(r.leaf) < addrs_.size()
                                    ? addrs_[static_cast<size_t>(r.leaf)]
                                    : std::to_string(r.leaf);
      return {r.status.error_code(), "leaf " + where + ": " + r.status.error_message()};
    }
    lists.push_back(&r.reply.docs());
  }
  resp->set_id(req.id());
  UnionSorted(lists, resp->mutable_docs());
  return grpc::Status::OK;
}

}  // namespace setalgebra
