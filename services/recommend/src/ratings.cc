#include "ratings.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>

namespace musku::recommend {
namespace {

constexpr char kMagic[8] = {'M', 'K', 'U', 'R', 'A', 'T', '0', '1'};
constexpr std::size_t kHeader = 24;
constexpr std::size_t kRecord = 12;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

std::uint32_t ShardOf(std::uint32_t user, std::uint32_t item, std::uint32_t shards) {
  std::uint64_t k = (static_cast<std::uint64_t>(user) << 32) | item;
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return static_cast<std::uint32_t>(k % shards);
}

RatingSet ReadRatings(const std::string& path, std::uint32_t shard, std::uint32_t shards) {
  if (shards == 0 || shard >= shards) throw DataError("need 0 <= shard < shards");
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) throw DataError(path + ": " + std::strerror(errno));
  unsigned char head[kHeader];
  if (std::fread(head, 1, kHeader, f.get()) != kHeader) throw DataError(path + ": truncated header (not a musku ratings file)");
  if (std::memcmp(head, kMagic, 8) != 0) throw DataError(path + ": bad magic (not a musku ratings file)");
  RatingSet out;
  std::uint64_t count = 0;
  std::memcpy(&out.users, head + 8, 4);
  std::memcpy(&out.items, head + 12, 4);
  std::memcpy(&count, head + 16, 8);
  if (out.users == 0 || out.items == 0 || count == 0) throw DataError(path + ": empty ratings header");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw DataError(path + ": " + std::strerror(errno));
  if (count > (1ull << 40) || static_cast<unsigned long long>(st.st_size) != kHeader + count * kRecord) {
    throw DataError(path + ": size " + std::to_string(st.st_size) + " bytes does not match " +
                    std::to_string(count) + " ratings (truncated or corrupt)");
  }
  std::vector<unsigned char> buf(1 << 20);
  std::uint64_t done = 0;
  while (done < count) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(count - done, buf.size() / kRecord));
    if (std::fread(buf.data(), kRecord, n, f.get()) != n) throw DataError(path + ": short read (truncated)");
    for (std::size_t i = 0; i < n; ++i) {
      Rating r{};
      std::memcpy(&r.user, buf.data() + i * kRecord, 4);
      std::memcpy(&r.item, buf.data() + i * kRecord + 4, 4);
      std::memcpy(&r.rating, buf.data() + i * kRecord + 8, 4);
      if (r.user >= out.users || r.item >= out.items || !std::isfinite(r.rating)) {
        throw DataError(path + ": rating " + std::to_string(done + i) + " has an id out of range or a non-finite value");
      }
      if (shards == 1 || ShardOf(r.user, r.item, shards) == shard) out.ratings.push_back(r);
    }
    done += n;
  }
  return out;
}

void WriteRatings(const std::string& path, const RatingSet& r) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) throw DataError(path + ": " + std::strerror(errno));
  unsigned char head[kHeader];
  std::memcpy(head, kMagic, 8);
  std::memcpy(head + 8, &r.users, 4);
  std::memcpy(head + 12, &r.items, 4);
  const std::uint64_t count = r.ratings.size();
  std::memcpy(head + 16, &count, 8);
  bool ok = std::fwrite(head, 1, kHeader, f.get()) == kHeader;
  for (const Rating& x : r.ratings) {
    unsigned char rec[kRecord];
    std::memcpy(rec, &x.user, 4);
    std::memcpy(rec + 4, &x.item, 4);
    std::memcpy(rec + 8, &x.rating, 4);
    ok = ok && std::fwrite(rec, 1, kRecord, f.get()) == kRecord;
  }
  if (!ok) throw DataError(path + ": write failed");
}

CfModel::CfModel(const RatingSet& data, const CfOptions& opts)
    : users_(data.users), items_(data.items), opts_(opts) {
  if (data.ratings.empty()) throw std::invalid_argument("recommend: no ratings in this shard");
  if (opts.rank == 0 || opts.neighbours == 0) throw std::invalid_argument("recommend: rank and neighbours must be > 0");
  const std::size_t nnz = data.ratings.size();
  // Means (the CF baseline) and the rating scale.
  std::vector<double> usum(users_, 0), isum(items_, 0);
  std::vector<std::uint32_t> ucnt(users_, 0), icnt(items_, 0);
  double gsum = 0;
  min_rating_ = max_rating_ = data.ratings[0].rating;
  for (const Rating& r : data.ratings) {
    usum[r.user] += r.rating;
    ++ucnt[r.user];
    isum[r.item] += r.rating;
    ++icnt[r.item];
    gsum += r.rating;
    min_rating_ = std::min(min_rating_, r.rating);
    max_rating_ = std::max(max_rating_, r.rating);
  }
  global_mean_ = static_cast<float>(gsum / static_cast<double>(nnz));
  user_mean_.assign(users_, NAN);
  item_mean_.assign(items_, NAN);
  for (std::uint32_t u = 0; u < users_; ++u) {
    if (ucnt[u] != 0) user_mean_[u] = static_cast<float>(usum[u] / ucnt[u]);
  }
  for (std::uint32_t i = 0; i < items_; ++i) {
    if (icnt[i] != 0) item_mean_[i] = static_cast<float>(isum[i] / icnt[i]);
  }
  // CSC by item for neighbour lookup.
  item_start_.assign(static_cast<std::size_t>(items_) + 1, 0);
  for (const Rating& r : data.ratings) ++item_start_[r.item + 1];
  std::partial_sum(item_start_.begin(), item_start_.end(), item_start_.begin());
  item_user_.resize(nnz);
  item_rating_.resize(nnz);
  {
    std::vector<std::uint32_t> pos(item_start_.begin(), item_start_.end() - 1);
    for (const Rating& r : data.ratings) {
      item_user_[pos[r.item]] = r.user;
      item_rating_[pos[r.item]++] = r.rating;
    }
  }

  // Masked NMF by multiplicative updates: only observed entries count.
  //   W <- W .* (R H') ./ (P H'),   H <- H .* (W' R) ./ (W' P),   P = (W H) on R's pattern.
  arma::umat loc(2, nnz);
  arma::fvec val(nnz);
  for (std::size_t k = 0; k < nnz; ++k) {
    loc(0, k) = data.ratings[k].user;
    loc(1, k) = data.ratings[k].item;
    val(k) = data.ratings[k].rating;
  }
  // Duplicate (user, item) pairs are summed by the batch constructor's add mode; keep the mean
  // scale by building R from the same locations as P below.
  const arma::sp_fmat R(true, loc, val, users_, items_, true, false);
  arma::arma_rng::set_seed(opts.seed);
  const float init = std::sqrt(global_mean_ / static_cast<float>(opts.rank));
  arma::fmat W = init * (0.5f + arma::randu<arma::fmat>(users_, opts.rank));
  arma::fmat H = init * (0.5f + arma::randu<arma::fmat>(opts.rank, items_));
  const float eps = 1e-9f;
  // Observed-pattern product, computed entry by entry (nnz x rank work).
  auto observed = [&](const arma::fmat& w, const arma::fmat& h) {
    arma::fvec p(nnz);
    for (std::size_t k = 0; k < nnz; ++k) {
      p(k) = arma::dot(w.row(static_cast<arma::uword>(loc(0, k))), h.col(static_cast<arma::uword>(loc(1, k))));
    }
    return arma::sp_fmat(true, loc, p, users_, items_, true, false);
  };
  for (std::uint32_t it = 0; it < opts.iterations; ++it) {
    arma::sp_fmat P = observed(W, H);
    W %= arma::fmat(R * H.t()) / (arma::fmat(P * H.t()) + eps);
    P = observed(W, H);
    H %= arma::fmat(W.t() * R) / (arma::fmat(W.t() * P) + eps);
  }
  {
    const arma::sp_fmat P = observed(W, H);
    double se = 0;
    for (std::size_t k = 0; k < nnz; ++k) {
      const double d = static_cast<double>(P(loc(0, k), loc(1, k))) - val(k);
      se += d * d;
    }
    train_rmse_ = std::sqrt(se / static_cast<double>(nnz));
  }
  // Unit user-factor columns: cosine similarity = dot product.
  unit_w_ = W.t();
  for (arma::uword u = 0; u < unit_w_.n_cols; ++u) {
    const float n = arma::norm(unit_w_.col(u));
    if (n > 0) unit_w_.col(u) /= n;
  }
}

CfModel::Result CfModel::Predict(std::uint32_t user, std::uint32_t item, float* rating,
                                 std::uint32_t* neighbours) const {
  if (user >= users_) return Result::kUnknownUser;
  if (item >= items_) return Result::kUnknownItem;
  *neighbours = 0;
  const float base = !std::isnan(user_mean_[user]) ? user_mean_[user]
                     : !std::isnan(item_mean_[item]) ? item_mean_[item]
                                                     : global_mean_;
  if (std::isnan(user_mean_[user])) {  // user has no ratings in this shard: no CF possible
    *rating = base;
    return Result::kOk;
  }
  thread_local std::vector<std::pair<float, std::uint32_t>> sims;  // (similarity, index into item's raters)
  sims.clear();
  const arma::fvec mine = unit_w_.col(user);
  for (std::uint32_t k = item_start_[item]; k < item_start_[item + 1]; ++k) {
    const std::uint32_t v = item_user_[k];
    if (v == user) continue;
    const float s = arma::dot(mine, unit_w_.col(v));
    if (s > 0) sims.emplace_back(s, k);
  }
  const std::size_t n = std::min<std::size_t>(opts_.neighbours, sims.size());
  std::partial_sort(sims.begin(), sims.begin() + static_cast<long>(n), sims.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  double num = 0, den = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const std::uint32_t k = sims[j].second;
    num += sims[j].first * (item_rating_[k] - user_mean_[item_user_[k]]);
    den += sims[j].first;
  }
  float pred = base;
  if (den > 0) pred = static_cast<float>(base + num / den);
  *rating = std::clamp(pred, min_rating_, max_rating_);
  *neighbours = static_cast<std::uint32_t>(n);
  return Result::kOk;
}

}  // namespace musku::recommend
