// Recommend rating files, NMF and user-based collaborative filtering.
//
// File format (written by musku/services/datasets.py, little-endian):
//   bytes 0..7   magic "MKURAT01"
//   bytes 8..11  uint32 users      (dense ids 0 .. users-1)
//   bytes 12..15 uint32 items
//   bytes 16..23 uint64 count
//   then count records of {uint32 user, uint32 item, float32 rating}.
#pragma once

#include <armadillo>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace musku::recommend {

class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Rating {
  std::uint32_t user;
  std::uint32_t item;
  float rating;
};

struct RatingSet {
  std::uint32_t users = 0;
  std::uint32_t items = 0;
  std::vector<Rating> ratings;
};

// Which shard (of `shards`) a (user, item) rating belongs to: a hash of the pair, so every
// shard sees every user and item in proportion.
std::uint32_t ShardOf(std::uint32_t user, std::uint32_t item, std::uint32_t shards);

// Reads the ratings of shard `shard` of `shards` (all with shards == 1). Validates the magic,
// the exact size, ids inside [0, users) x [0, items) and finite ratings. Throws DataError.
RatingSet ReadRatings(const std::string& path, std::uint32_t shard = 0, std::uint32_t shards = 1);
void WriteRatings(const std::string& path, const RatingSet& r);

struct CfOptions {
  std::uint32_t rank = 16;         // NMF factors
  std::uint32_t iterations = 100;  // multiplicative-update sweeps
  std::uint32_t neighbours = 40;   // most similar users (who rated the item) in a prediction
  std::uint64_t seed = 1;
};

// One shard's model: masked NMF R ~ W H over the observed ratings (Lee & Seung multiplicative
// updates restricted to observed entries), then user-based CF with cosine similarity of W rows.
class CfModel {
 public:
  CfModel(const RatingSet& data, const CfOptions& opts);  // throws std::invalid_argument

  enum class Result { kOk, kUnknownUser, kUnknownItem };
  // Predicted rating of (user, item); *neighbours = similar users used (0: fallback to the
  // user's / item's / global mean).
  Result Predict(std::uint32_t user, std::uint32_t item, float* rating, std::uint32_t* neighbours) const;

  // Root-mean-square error of the NMF reconstruction on the training ratings.
  double TrainRmse() const { return train_rmse_; }
  std::uint32_t users() const { return users_; }
  std::uint32_t items() const { return items_; }

 private:
  std::uint32_t users_, items_;
  CfOptions opts_;
  arma::fmat unit_w_;                                        // rank x users, columns normalised
  std::vector<std::uint32_t> item_start_;                    // CSC by item: raters of each item
  std::vector<std::uint32_t> item_user_;
  std::vector<float> item_rating_;
  std::vector<float> user_mean_;                             // NaN if no ratings in this shard
  std::vector<float> item_mean_;
  float global_mean_ = 0, min_rating_ = 0, max_rating_ = 0;
  double train_rmse_ = 0;
};

}  // namespace musku::recommend
