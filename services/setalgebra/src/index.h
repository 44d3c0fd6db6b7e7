// Set Algebra data: the index file format, tokenising with stop words, posting lists with skip
// pointers, intersection; the synthetic and WordNet corpus generators.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace setalgebra {

// A sorted posting list with a skip pointer every kSkip entries and, when the list is dense over
// its span, also a bitmap (bit i <=> doc (i << shift) | residue, words aligned to absolute doc
// positions so that dense lists AND word by word). A shard's documents all share one residue
// modulo the shard count; for a power-of-two count the bitmap skips the other shards' ids.
class PostingList {
 public:
  static constexpr size_t kSkip = 64;
  static constexpr size_t kMinBitmap = 256;  // shorter lists are cheap to scan
  static constexpr size_t kDenseBits = 256;  // bitmap when its bits <= kDenseBits * size()
  PostingList() = default;
  // `docs` must be ascending and unique; `stride` (a power of two, e.g. the shard count when
  // every doc has the same residue modulo it) lets a bitmap index doc >> log2(stride).
  explicit PostingList(std::vector<uint32_t> docs, uint32_t stride = 1);
  const std::vector<uint32_t>& docs() const { return docs_; }
  size_t size() const { return docs_.size(); }
  // First position >= from whose doc is >= target (skips whole blocks, then scans).
  size_t Seek(size_t from, uint32_t target) const;
  bool has_bitmap() const { return !bits_.empty(); }
  // Membership through the bitmap (only when has_bitmap()).
  bool Contains(uint32_t doc) const {
    if ((doc & mask_) != residue_) return false;
    const uint64_t i = static_cast<uint64_t>(doc >> shift_);
    if (i < word0_ * 64) return false;
    const uint64_t k = i / 64 - word0_;
    return k < bits_.size() && ((bits_[k] >> (i % 64)) & 1U);
  }

 private:
  friend void Intersect(std::vector<const PostingList*> lists, std::vector<uint32_t>* out);
  std::vector<uint32_t> docs_;
  std::vector<uint32_t> skips_;  // skips_[b] = docs_[b * kSkip]
  std::vector<uint64_t> bits_;   // bits_[k] covers indices (word0_ + k) * 64 ...
  uint64_t word0_ = 0;
  uint32_t shift_ = 0, mask_ = 0, residue_ = 0;
};

// Intersection of all lists into *out (ascending): dense lists AND their bitmaps word by word;
// otherwise the shortest list drives, probing bitmaps and seeking (skip pointers) the others.
void Intersect(std::vector<const PostingList*> lists, std::vector<uint32_t>* out);

// term -> postings, holding only the documents of one shard.
class Index {
 public:
  // Loads `path` (format below), keeping docs with doc % num_shards == shard.
  // Returns "" or a clear message (missing, not an index, truncated, checksum mismatch).
  std::string Load(const std::string& path, int shard, int num_shards);
  const PostingList* Find(std::string_view term) const;
  size_t num_terms() const { return map_.size(); }
  uint64_t num_postings() const { return postings_; }
  uint32_t num_docs() const { return num_docs_; }

  // The leaf's operation: unknown term -> empty result.
  void Query(const std::vector<std::string>& terms, std::vector<uint32_t>* out) const;

  void Add(const std::string& term, std::vector<uint32_t> docs, uint32_t stride = 1) {
    postings_ += docs.size();
    map_[term] = PostingList(std::move(docs), stride);
  }

 private:
  std::unordered_map<std::string, PostingList> map_;
  uint64_t postings_ = 0;
  uint32_t num_docs_ = 0;
};

// Index file: "MSAIDX01" | u32 num_docs | u32 num_terms | per term: u16 len, bytes, u32 count,
// count x u32 ascending doc ids | u64 FNV-1a of everything before it. Little-endian.
struct RawIndex {
  uint32_t num_docs = 0;
  std::vector<std::pair<std::string, std::vector<uint32_t>>> terms;
};
std::string WriteIndexFile(const std::string& path, const RawIndex& idx);
std::string ReadIndexFile(const std::string& path, RawIndex* out);

bool IsStopWord(std::string_view w);
// Lower-cased alphabetic tokens (apostrophes and digits split words), length >= 2.
std::vector<std::string> Tokenize(std::string_view text);

// Synthetic: `terms` words; word of rank r appears in ~max(min_df, docs*top_frac/r^0.8) random
// documents of [0, docs). Seeded, deterministic.
RawIndex Synthesize(uint32_t docs, uint32_t terms, uint64_t seed);
// WordNet glosses (data.noun/verb/adj/adv): one document per synset gloss, stop words excluded.
// Returns "" or why not.
std::string IndexWordNet(const std::string& dir, RawIndex* out);
// Queries of 2..5 terms, terms drawn Zipf(s=1)-weighted by document frequency rank.
std::vector<std::vector<std::string>> MakeQueries(const RawIndex& idx, size_t n, uint64_t seed,
                                                  int min_terms = 2, int max_terms = 5);

}  // namespace setalgebra
