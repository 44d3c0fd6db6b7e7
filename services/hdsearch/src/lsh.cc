#include "lsh.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>

#include "vectors.h"

namespace musku::hdsearch {
namespace {

inline std::uint64_t Fmix64(std::uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

LshIndex::LshIndex(std::uint32_t dim, const LshParams& params) : dim_(dim), params_(params) {
  if (dim == 0) throw std::invalid_argument("lsh: dim must be > 0");
  if (params.tables == 0 || params.tables > 256) throw std::invalid_argument("lsh: tables must be 1..256");
  if (params.hashes == 0 || params.hashes > 64) throw std::invalid_argument("lsh: hashes must be 1..64");
  if (!(params.bucket_width > 0.0f) || !std::isfinite(params.bucket_width)) {
    throw std::invalid_argument("lsh: bucket width must be > 0");
  }
  if (params.probes > 1024) throw std::invalid_argument("lsh: probes must be <= 1024");
  const std::size_t lk = static_cast<std::size_t>(params.tables) * params.hashes;
  std::mt19937_64 rng(params.seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  proj_.resize(lk * dim);
  for (float& x : proj_) x = gauss(rng) / params.bucket_width;
  offset_.resize(lk);
  for (float& x : offset_) x = unif(rng);  // b / w with b ~ U[0, w)
  mix_.resize(params.hashes);
  for (auto& m : mix_) m = rng() | 1ULL;
  tables_.resize(params.tables);
}

void LshIndex::Project(const float* v, float* f) const {
  const std::size_t lk = offset_.size();
  for (std::size_t j = 0; j < lk; ++j) f[j] = Dot(proj_.data() + j * dim_, v, dim_) + offset_[j];
}

std::uint64_t LshIndex::Key(std::uint32_t table, const std::int32_t* h) const {
  std::uint64_t key = 0x9e3779b97f4a7c15ULL * (table + 1);
  for (std::uint32_t i = 0; i < params_.hashes; ++i) {
    key += mix_[i] * static_cast<std::uint64_t>(static_cast<std::uint32_t>(h[i]));
    key = (key << 29) | (key >> 35);
  }
  return Fmix64(key);
}

void LshIndex::Add(const float* rows, std::size_t n, std::uint32_t first_id) {
  if (finalized_) throw std::logic_error("lsh: Add after Finalize");
  const std::uint32_t K = params_.hashes;
  std::vector<float> f(offset_.size());
  std::vector<std::int32_t> h(K);
  for (std::size_t r = 0; r < n; ++r) {
    Project(rows + r * dim_, f.data());
    const std::uint32_t id = first_id + static_cast<std::uint32_t>(r);
    for (std::uint32_t t = 0; t < params_.tables; ++t) {
      for (std::uint32_t i = 0; i < K; ++i) h[i] = static_cast<std::int32_t>(std::floor(f[t * K + i]));
      tables_[t].pending.emplace_back(Key(t, h.data()), id);
    }
    max_id_ = std::max(max_id_, id);
  }
  num_points_ += n;
}

void LshIndex::Finalize() {
  for (Table& t : tables_) {
    std::sort(t.pending.begin(), t.pending.end());
    t.ids.reserve(t.pending.size());
    std::size_t distinct = 0;
    for (std::size_t i = 0; i < t.pending.size(); ++i)
      if (i == 0 || t.pending[i].first != t.pending[i - 1].first) ++distinct;
    std::size_t cap = 16;
    while (cap < 2 * distinct) cap <<= 1;  // load factor <= 1/2
    t.slots.assign(cap, Table::Slot{0, 0, 0});
    t.mask = cap - 1;
    t.buckets = distinct;
    for (std::size_t i = 0; i < t.pending.size();) {
      const std::uint64_t key = t.pending[i].first;
      const auto begin = static_cast<std::uint32_t>(t.ids.size());
      for (; i < t.pending.size() && t.pending[i].first == key; ++i) t.ids.push_back(t.pending[i].second);
      std::uint64_t j = key & t.mask;
      while (t.slots[j].begin != t.slots[j].end) j = (j + 1) & t.mask;
      t.slots[j] = Table::Slot{key, begin, static_cast<std::uint32_t>(t.ids.size())};
    }
    t.pending.clear();
    t.pending.shrink_to_fit();
  }
  finalized_ = true;
}

std::size_t LshIndex::num_buckets() const {
  std::size_t n = 0;
  for (const Table& t : tables_) n += t.buckets;
  return n;
}

// Three passes, so that the ~L x (T + 1) bucket lookups, which miss the cache (the tables are
// megabytes; at low load nothing of them is cached between queries), overlap instead of
// waiting one after another:
//   1. every probe's key, table by table (the multi-probe heap is pure arithmetic), each slot
//      prefetched as soon as its key is known;
//   2. every slot read, each non-empty bucket's ids prefetched;
//   3. every id set in a bitmap over point ids, then the bitmap scanned and cleared: the
//      candidates come out deduplicated and in ascending id order (grouped by shard), with no
//      sort.
void LshIndex::Query(const float* q, LshScratch* s, std::vector<std::uint32_t>* out) const {
  using Step = LshScratch::Step;
  using Pert = LshScratch::Perturbation;
  if (!finalized_) throw std::logic_error("lsh: Query before Finalize");
  const std::size_t words = static_cast<std::size_t>(max_id_) / 64 + 1;
  if (s->seen.size() < words) s->seen.assign(words, 0);
  const std::uint32_t K = params_.hashes;
  s->proj.resize(offset_.size());
  s->h.resize(K);
  s->steps.resize(2 * K);
  s->probes.clear();
  float* f = s->proj.data();
  std::int32_t* h = s->h.data();
  Step* steps = s->steps.data();
  Project(q, f);
  const auto greater = std::greater<Pert>();

  // 1. Keys. A perturbation set never steps one hash both ways (such a set is skipped).
  for (std::uint32_t t = 0; t < params_.tables; ++t) {
    const Table& table = tables_[t];
    auto probe = [&](std::uint64_t key) {
      __builtin_prefetch(&table.slots[key & table.mask]);
      s->probes.push_back({key, t});
    };
    for (std::uint32_t i = 0; i < K; ++i) {
      const float x = f[t * K + i];
      const float fl = std::floor(x);
      h[i] = static_cast<std::int32_t>(fl);
      steps[i] = {x - fl, i, -1};
      steps[K + i] = {1.0f - (x - fl), i, +1};
    }
    probe(Key(t, h));
    if (params_.probes > 0) {
      std::sort(steps, steps + 2 * K, [](const Step& a, const Step& b) { return a.dist < b.dist; });
      auto& heap = s->heap;
      heap.clear();
      heap.push_back(Pert{steps[0].dist * steps[0].dist, 0, {1, 0}});
      std::uint32_t emitted = 0;
      while (!heap.empty() && emitted < params_.probes) {
        std::pop_heap(heap.begin(), heap.end(), greater);
        const Pert c = heap.back();
        heap.pop_back();
        const unsigned last = c.last;
        if (last + 1u < 2 * K) {
          const unsigned next = last + 1;
          const float d_last = steps[last].dist, d_next = steps[next].dist;
          Pert shifted = c;  // replace the largest position by the next one
          shifted.bits[last >> 6] &= ~(1ULL << (last & 63));
          shifted.bits[next >> 6] |= 1ULL << (next & 63);
          shifted.last = static_cast<std::uint8_t>(next);
          shifted.score = c.score - d_last * d_last + d_next * d_next;
          heap.push_back(shifted);
          std::push_heap(heap.begin(), heap.end(), greater);
          Pert expanded = c;  // add the next position
          expanded.bits[next >> 6] |= 1ULL << (next & 63);
          expanded.last = static_cast<std::uint8_t>(next);
          expanded.score = c.score + d_next * d_next;
          heap.push_back(expanded);
          std::push_heap(heap.begin(), heap.end(), greater);
        }
        s->hp.assign(h, h + K);
        std::int32_t* hp = s->hp.data();
        bool valid = true;
        std::uint64_t stepped = 0;
        for (unsigned w = 0; w < 2 && valid; ++w) {
          for (std::uint64_t b = c.bits[w]; b != 0; b &= b - 1) {
            const Step& st = steps[w * 64 + static_cast<unsigned>(__builtin_ctzll(b))];
            if (stepped & (1ULL << st.hash)) {
              valid = false;
              break;
            }
            stepped |= 1ULL << st.hash;
            hp[st.hash] += st.delta;
          }
        }
        if (!valid) continue;
        probe(Key(t, hp));
        ++emitted;
      }
    }
  }

  // 2. Slots -> id ranges.
  s->ranges.clear();
  for (const auto& p : s->probes) {
    const Table& table = tables_[p.table];
    const Table::Slot& slot = table.Find(p.key);
    if (slot.begin == slot.end) continue;
    __builtin_prefetch(&table.ids[slot.begin]);
    s->ranges.push_back({p.table, slot.begin, slot.end});
  }

  // 3. Ids -> bitmap -> ascending, distinct candidates. A bucket's ids ascend, so its first and
  // last bound the words to scan.
  std::uint64_t* seen = s->seen.data();
  std::size_t lo = words, hi = 0;
  for (const auto& r : s->ranges) {
    const std::uint32_t* ids = tables_[r.table].ids.data();
    lo = std::min<std::size_t>(lo, ids[r.begin] >> 6);
    hi = std::max<std::size_t>(hi, ids[r.end - 1] >> 6);
    for (std::uint32_t i = r.begin; i < r.end; ++i) seen[ids[i] >> 6] |= 1ULL << (ids[i] & 63);
  }
  for (std::size_t w = lo; w <= hi; ++w) {
    for (std::uint64_t b = seen[w]; b != 0; b &= b - 1) {
      out->push_back(static_cast<std::uint32_t>(w * 64 + static_cast<unsigned>(__builtin_ctzll(b))));
    }
    seen[w] = 0;
  }
}

float EstimateBucketWidth(const float* rows, std::size_t n, std::uint32_t dim, std::uint64_t seed,
                          float scale) {
  if (n < 2) throw std::invalid_argument("lsh: need at least 2 points to estimate the bucket width");
  std::mt19937_64 rng(seed ^ 0x5eedULL);
  const std::size_t sample = std::min<std::size_t>(n, 4000);
  const std::size_t probes = std::min<std::size_t>(sample, 100);
  std::vector<std::size_t> idx(n);
  for (std::size_t i = 0; i < n; ++i) idx[i] = i;
  for (std::size_t i = 0; i < sample; ++i) {
    std::swap(idx[i], idx[i + std::uniform_int_distribution<std::size_t>(0, n - 1 - i)(rng)]);
  }
  std::vector<float> nn;
  for (std::size_t p = 0; p < probes; ++p) {
    float best = INFINITY;
    for (std::size_t j = 0; j < sample; ++j) {
      if (j == p) continue;
      best = std::min(best, SquaredL2(rows + idx[p] * dim, rows + idx[j] * dim, dim));
    }
    nn.push_back(std::sqrt(best));
  }
  std::nth_element(nn.begin(), nn.begin() + static_cast<long>(nn.size() / 2), nn.end());
  const float w = nn[nn.size() / 2] * scale;
  return w > 0.0f ? w : 1.0f;  // all duplicates: any positive width works
}

std::vector<std::uint32_t> BruteForceKnn(const float* rows, std::size_t n, std::uint32_t dim,
                                         const float* q, std::size_t k) {
  std::vector<std::pair<float, std::uint32_t>> d(n);
  for (std::size_t i = 0; i < n; ++i) d[i] = {SquaredL2(rows + i * dim, q, dim), static_cast<std::uint32_t>(i)};
  k = std::min(k, n);
  std::partial_sort(d.begin(), d.begin() + static_cast<long>(k), d.end());
  std::vector<std::uint32_t> out(k);
  for (std::size_t i = 0; i < k; ++i) out[i] = d[i].second;
  return out;
}

}  // namespace musku::hdsearch
