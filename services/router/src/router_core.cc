#include "router_core.h"

#include <algorithm>
#include <random>
#include <stdexcept>

#include "placement.h"

namespace musku::router {
namespace {

std::uint32_t RandomBelow(std::uint32_t n) {
  thread_local std::minstd_rand rng{std::random_device{}()};
  return std::uniform_int_distribution<std::uint32_t>(0, n - 1)(rng);
}

grpc::Status Invalid(const std::string& why) { return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why); }

}  // namespace

RouterPolicy::RouterPolicy(RouterOptions opts) : opts_(std::move(opts)) {
  if (opts_.leaves.empty()) throw std::invalid_argument("router: no leaves given (--leaves)");
  if (opts_.replicas == 0) throw std::invalid_argument("router: --replicas must be >= 1");
  const std::uint32_t r = std::min<std::uint32_t>(opts_.replicas, num_leaves());
  quorum_ = opts_.write_quorum == 0 ? r / 2 + 1 : opts_.write_quorum;
  if (quorum_ > r) throw std::invalid_argument("router: --write-quorum larger than the replica count");
  for (const std::string& addr : opts_.leaves) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stubs_.push_back(RouterLeaf::NewStub(grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args)));
  }
}

std::vector<std::uint32_t> RouterPolicy::Replicas(const std::string& key) const {
  return ReplicaSet(key, num_leaves(), opts_.replicas);
}

grpc::Status RouterPolicy::GetFrom(std::uint32_t leaf, const GetRequest& req, GetReply* reply) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + opts_.leaf_timeout);
  return stubs_[leaf]->Get(&ctx, req, reply);
}

// ---- Get --------------------------------------------------------------------------------------

grpc::Status GetHandler::Process(const GetRequest& req, FanOut<GetRequest>* out) {
  if (std::string why = ValidateKey(req.key()); !why.empty()) return Invalid(why);
  const auto rs = policy_->Replicas(req.key());
  *out->To(static_cast<int>(rs[RandomBelow(static_cast<std::uint32_t>(rs.size()))])) = req;
  return grpc::Status::OK;
}

grpc::Status GetHandler::Finalize(const GetRequest& req, std::vector<musku::LeafReply<GetReply>>& replies,
                                  GetReply* resp) {
  std::uint32_t attempts = 1, misses = 0;
  std::string last_error;
  auto take = [&](std::uint32_t leaf, GetReply& r) {
    resp->set_value(std::move(*r.mutable_value()));
    resp->set_flags(r.flags());
    resp->set_leaf(leaf);
    resp->set_attempts(attempts);
    return grpc::Status::OK;
  };
  auto note = [&](std::uint32_t leaf, const grpc::Status& st) {
    if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
      ++misses;
    } else {
      last_error = "leaf " + std::to_string(leaf) + ": " + st.error_message();
    }
  };
  auto& first = replies.at(0);
  const auto first_leaf = static_cast<std::uint32_t>(first.leaf);
  if (first.status.ok()) return take(first_leaf, first.reply);
  if (first.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) return first.status;
  note(first_leaf, first.status);
  // Failover: the other replicas, in ring order after the one tried.
  const auto rs = policy_->Replicas(req.key());
  const auto pos = static_cast<std::size_t>(std::find(rs.begin(), rs.end(), first_leaf) - rs.begin());
  for (std::size_t i = 1; i < rs.size(); ++i) {
    const std::uint32_t leaf = rs[(pos + i) % rs.size()];
    ++attempts;
    GetReply r;
    grpc::Status st = policy_->GetFrom(leaf, req, &r);
    if (st.ok()) return take(leaf, r);
    note(leaf, st);
  }
  if (misses > 0) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such key");
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no replica answered (" + last_error + ")");
}

// ---- Set --------------------------------------------------------------------------------------

grpc::Status SetHandler::Process(const SetRequest& req, FanOut<SetRequest>* out) {
  if (std::string why = ValidateKey(req.key()); !why.empty()) return Invalid(why);
  if (req.value().size() > kMaxValueBytes) return Invalid("value larger than memcached's item limit");
  for (std::uint32_t leaf : policy_->Replicas(req.key())) *out->To(static_cast<int>(leaf)) = req;
  return grpc::Status::OK;
}

grpc::Status SetHandler::Finalize(const SetRequest&, std::vector<musku::LeafReply<SetReply>>& replies,
                                  SetReply* resp) {
  std::uint32_t stored = 0;
  std::string errors;
  for (const auto& r : replies) {
    if (r.status.ok()) {
      ++stored;
    } else {
      if (r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) return r.status;
      errors += " leaf " + std::to_string(r.leaf) + ": " + r.status.error_message() + ";";
    }
  }
  resp->set_stored(stored);
  resp->set_replicas(static_cast<std::uint32_t>(replies.size()));
  if (stored < policy_->write_quorum()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "stored on " + std::to_string(stored) + " of " + std::to_string(replies.size()) +
                            " replicas, quorum " + std::to_string(policy_->write_quorum()) + ":" + errors);
  }
  return grpc::Status::OK;
}

}  // namespace musku::router
