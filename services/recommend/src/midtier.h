// The Recommend mid-tier's request logic: ask every leaf, average the predictions of those
// that answered. NOT_FOUND (unknown user/item) from a leaf is final; UNAVAILABLE if none answered.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "musku/framework.h"
#include "recommend.grpc.pb.h"

namespace musku::recommend {

class PredictHandler final : public MidTierHandler<PredictRequest, PredictReply, PredictRequest, PredictReply> {
 public:
  grpc::Status Process(const PredictRequest& req, FanOut<PredictRequest>* out) override {
    for (int i = 0; i < out->num_leaves(); ++i) *out->To(i) = req;
    return grpc::Status::OK;
  }

  grpc::Status Finalize(const PredictRequest&, std::vector<musku::LeafReply<PredictReply>>& replies,
                        PredictReply* resp) override {
    double sum = 0;
    std::uint32_t answered = 0, failed = 0, neighbours = 0;
    std::string last_error;
    for (const auto& r : replies) {
      if (r.status.error_code() == grpc::StatusCode::NOT_FOUND ||
          r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
        return r.status;  // every leaf knows the same id space
      }
      if (!r.status.ok() || !std::isfinite(r.reply.rating())) {
        ++failed;
        last_error = "leaf " + std::to_string(r.leaf) + ": " +
                     (r.status.ok() ? std::string("non-finite rating") : r.status.error_message());
        continue;
      }
      sum += r.reply.rating();
      neighbours += r.reply.neighbours();
      ++answered;
    }
    resp->set_leaves_answered(answered);
    resp->set_leaves_failed(failed);
    if (answered == 0) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no leaf answered (" + last_error + ")");
    resp->set_rating(static_cast<float>(sum / answered));
    resp->set_neighbours(neighbours);
    return grpc::Status::OK;
  }
};

}  // namespace musku::recommend
