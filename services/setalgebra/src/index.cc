#include "index.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cctype>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <unordered_set>

namespace setalgebra {

// ------------------------------------------------------------------------------------------
// Posting lists

PostingList::PostingList(std::vector<uint32_t> docs, uint32_t stride) : docs_(std::move(docs)) {
  skips_.reserve(docs_.size() / kSkip + 1);
  for (size_t i = 0; i < docs_.size(); i += kSkip) skips_.push_back(docs_[i]);
  if (docs_.size() < kMinBitmap) return;
  if (stride == 0 || (stride & (stride - 1)) != 0) stride = 1;
  uint32_t shift = 0;
  while ((1U << shift) < stride) ++shift;
  const uint32_t mask = stride - 1, residue = docs_.front() & mask;
  for (uint32_t d : docs_)
    if ((d & mask) != residue) {  // not one shard's ids: index every doc id
      shift = 0;
      break;
    }
  mask_ = (1U << shift) - 1;
  residue_ = docs_.front() & mask_;
  shift_ = shift;
  const uint64_t first = (docs_.front() >> shift) / 64, last = (docs_.back() >> shift) / 64;
  const uint64_t words = last - first + 1;
  if (words * 64 > kDenseBits * docs_.size()) return;  // sparse: the array alone
  word0_ = first;
  bits_.assign(words, 0);
  for (uint32_t d : docs_) {
    const uint64_t i = d >> shift;
    bits_[i / 64 - first] |= uint64_t{1} << (i % 64);
  }
}

size_t PostingList::Seek(size_t from, uint32_t target) const {
  const size_t n = docs_.size();
  if (from >= n || docs_[from] >= target) return from;
  // Skip whole blocks whose next block still starts at or below the target.
  size_t b = from / kSkip;
  const size_t nb = skips_.size();
  if (b + 1 < nb && skips_[b + 1] <= target) {
    // gallop over the skip pointers, then binary search among them
    size_t step = 1, hi = b + 1;
    while (hi + step < nb && skips_[hi + step] <= target) {
      hi += step;
      step *= 2;
    }
    const size_t lim = std::min(nb, hi + step + 1);
    b = static_cast<size_t>(std::upper_bound(skips_.begin() + static_cast<long>(hi),
                                             skips_.begin() + static_cast<long>(lim), target) -
                            skips_.begin()) - 1;
    from = std::max(from, b * kSkip);
  }
  const size_t end = std::min(n, (b + 1) * kSkip);
  while (from < end && docs_[from] < target) ++from;
  return from;  // == end (< n) lands on the next block's first doc, which is > target
}

namespace {

// Every list has a bitmap with the same shift and residue: AND the words over the common range.
void AndBitmaps(uint64_t lo, uint64_t hi, uint32_t shift, uint32_t residue,
                const std::vector<uint64_t>& word0, const std::vector<const uint64_t*>& bits,
                std::vector<uint32_t>* out) {
  for (uint64_t w = lo; w < hi; ++w) {
    uint64_t x = bits[0][w - word0[0]];
    for (size_t j = 1; j < bits.size() && x; ++j) x &= bits[j][w - word0[j]];
    while (x) {
      const int b = __builtin_ctzll(x);
      x &= x - 1;
      out->push_back(static_cast<uint32_t>(((w * 64 + static_cast<uint64_t>(b)) << shift) | residue));
    }
  }
}

}  // namespace

void Intersect(std::vector<const PostingList*> lists, std::vector<uint32_t>* out) {
  out->clear();
  if (lists.empty()) return;
  std::sort(lists.begin(), lists.end(),
            [](const PostingList* a, const PostingList* b) { return a->size() < b->size(); });
  if (lists[0]->size() == 0) return;
  if (lists.size() == 1) {
    *out = lists[0]->docs();
    return;
  }
  // All dense, one shard's ids each: word-wise AND.
  bool all_bitmaps = true;
  for (const PostingList* l : lists)
    if (!l->has_bitmap() || l->shift_ != lists[0]->shift_ || l->residue_ != lists[0]->residue_)
      all_bitmaps = false;
  if (all_bitmaps) {
    uint64_t lo = 0, hi = UINT64_MAX;
    std::vector<uint64_t> word0;
    std::vector<const uint64_t*> bits;
    for (const PostingList* l : lists) {
      lo = std::max(lo, l->word0_);
      hi = std::min(hi, l->word0_ + l->bits_.size());
      word0.push_back(l->word0_);
      bits.push_back(l->bits_.data());
    }
    if (lo < hi) AndBitmaps(lo, hi, lists[0]->shift_, lists[0]->residue_, word0, bits, out);
    return;
  }
  // The shortest list drives; bitmaps answer membership in O(1), the others are sought.
  std::vector<const PostingList*> dense, sparse;
  for (size_t i = 1; i < lists.size(); ++i) (lists[i]->has_bitmap() ? dense : sparse).push_back(lists[i]);
  std::vector<size_t> pos(sparse.size(), 0);
  for (uint32_t d : lists[0]->docs()) {
    bool all = true;
    for (const PostingList* l : dense)
      if (!l->Contains(d)) {
        all = false;
        break;
      }
    if (!all) continue;
    for (size_t i = 0; i < sparse.size(); ++i) {
      pos[i] = sparse[i]->Seek(pos[i], d);
      if (pos[i] >= sparse[i]->size()) return;  // a list is exhausted: no more matches
      if (sparse[i]->docs()[pos[i]] != d) {
        all = false;
        break;
      }
    }
    if (all) out->push_back(d);
  }
}

// ------------------------------------------------------------------------------------------
// Index

const PostingList* Index::Find(std::string_view term) const {
  auto it = map_.find(std::string(term));
  return it == map_.end() ? nullptr : &it->second;
}

void Index::Query(const std::vector<std::string>& terms, std::vector<uint32_t>* out) const {
  std::vector<const PostingList*> lists;
  lists.reserve(terms.size());
  for (const auto& t : terms) {
    const PostingList* p = Find(t);
    if (!p) {  // unknown (or stop) word: nothing contains all terms
      out->clear();
      return;
    }
    lists.push_back(p);
  }
  Intersect(std::move(lists), out);
}

std::string Index::Load(const std::string& path, int shard, int num_shards) {
  if (num_shards < 1 || shard < 0 || shard >= num_shards)
    return "bad shard " + std::to_string(shard) + " of " + std::to_string(num_shards);
  RawIndex raw;
  if (std::string err = ReadIndexFile(path, &raw); !err.empty()) return err;
  map_.clear();
  postings_ = 0;
  num_docs_ = raw.num_docs;
  for (auto& [term, docs] : raw.terms) {
    std::vector<uint32_t> mine;
    if (num_shards == 1) {
      mine = std::move(docs);
    } else {
      for (uint32_t d : docs)
        if (static_cast<int>(d % static_cast<uint32_t>(num_shards)) == shard) mine.push_back(d);
    }
    if (!mine.empty()) Add(term, std::move(mine), static_cast<uint32_t>(num_shards));
  }
  return "";
}

// ------------------------------------------------------------------------------------------
// File format

namespace {
constexpr char kMagic[8] = {'M', 'S', 'A', 'I', 'D', 'X', '0', '1'};

struct Fnv {
  uint64_t h = 1469598103934665603ULL;
  void Add(const void* p, size_t n) {
    auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ULL;
    }
  }
};
}  // namespace

std::string WriteIndexFile(const std::string& path, const RawIndex& idx) {
  std::string buf(kMagic, sizeof kMagic);
  auto put = [&buf](const void* p, size_t n) { buf.append(static_cast<const char*>(p), n); };
  const uint32_t nt = static_cast<uint32_t>(idx.terms.size());
  put(&idx.num_docs, 4);
  put(&nt, 4);
  for (const auto& [term, docs] : idx.terms) {
    if (term.empty() || term.size() > 65535) return "term length out of range: '" + term + "'";
    const uint16_t len = static_cast<uint16_t>(term.size());
    put(&len, 2);
    put(term.data(), len);
    const uint32_t c = static_cast<uint32_t>(docs.size());
    put(&c, 4);
    put(docs.data(), docs.size() * 4);
  }
  Fnv f;
  f.Add(buf.data(), buf.size());
  put(&f.h, 8);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return "cannot write " + tmp;
    out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (!out) return "write failed: " + tmp;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return "cannot rename " + tmp + " to " + path;
  return "";
}

std::string ReadIndexFile(const std::string& path, RawIndex* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open index file " + path;
  std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (buf.size() < sizeof kMagic + 16 || std::memcmp(buf.data(), kMagic, sizeof kMagic) != 0)
    return path + " is not a Set Algebra index (bad magic or too short)";
  Fnv f;
  f.Add(buf.data(), buf.size() - 8);
  uint64_t stored = 0;
  std::memcpy(&stored, buf.data() + buf.size() - 8, 8);
  if (stored != f.h)
    return path + " is truncated or corrupt (checksum mismatch); regenerate it";
  size_t off = sizeof kMagic;
  const size_t end = buf.size() - 8;
  auto get = [&](void* p, size_t n) {
    if (off + n > end) return false;
    std::memcpy(p, buf.data() + off, n);
    off += n;
    return true;
  };
  RawIndex r;
  uint32_t nt = 0;
  if (!get(&r.num_docs, 4) || !get(&nt, 4)) return path + " is truncated (header)";
  r.terms.reserve(nt);
  for (uint32_t i = 0; i < nt; ++i) {
    uint16_t len = 0;
    uint32_t c = 0;
    std::string term;
    if (!get(&len, 2) || len == 0 || off + len > end) return path + " is corrupt (term " + std::to_string(i) + ")";
    term.assign(buf.data() + off, len);
    off += len;
    if (!get(&c, 4) || off + static_cast<size_t>(c) * 4 > end)
      return path + " is corrupt (postings of '" + term + "')";
    std::vector<uint32_t> docs(c);
    get(docs.data(), static_cast<size_t>(c) * 4);
    for (size_t k = 0; k < docs.size(); ++k)
      if (docs[k] >= r.num_docs || (k && docs[k] <= docs[k - 1]))
        return path + " is corrupt (postings of '" + term + "' not ascending / out of range)";
    r.terms.emplace_back(std::move(term), std::move(docs));
  }
  if (off != end) return path + " is corrupt (trailing bytes)";
  *out = std::move(r);
  return "";
}

// ------------------------------------------------------------------------------------------
// Text

bool IsStopWord(std::string_view w) {
  static const std::unordered_set<std::string_view> kStop = {
      "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are",
      "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but",
      "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "etc", "few",
      "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers",
      "herself", "him", "himself", "his", "how", "if", "in", "into", "is", "it", "its", "itself",
      "just", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off", "on",
      "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same",
      "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs", "them",
      "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too",
      "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which",
      "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself",
      "yourselves", "e", "g", "s", "used", "usually", "also", "especially", "often", "one"};
  return kStop.count(w) > 0;
}

std::vector<std::string> Tokenize(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (cur.size() >= 2) out.push_back(cur);
    cur.clear();
  };
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalpha(c))
      cur.push_back(static_cast<char>(std::tolower(c)));
    else
      flush();
  }
  flush();
  return out;
}

// ------------------------------------------------------------------------------------------
// Generators

namespace {
std::string SynthWord(uint32_t rank) {
  std::string w = "w";
  do {
    w.push_back(static_cast<char>('a' + rank % 26));
    rank /= 26;
  } while (rank);
  return w;
}
}  // namespace

RawIndex Synthesize(uint32_t docs, uint32_t terms, uint64_t seed) {
  RawIndex r;
  r.num_docs = docs;
  std::mt19937_64 rng(seed);
  const double top = 0.1 * docs;
  const uint32_t min_df = std::max<uint32_t>(1, std::min<uint32_t>(100, docs / 1000 + 1));
  std::uniform_int_distribution<uint32_t> pick(0, docs ? docs - 1 : 0);
  for (uint32_t t = 0; t < terms; ++t) {
    const double want = std::max<double>(min_df, top / std::pow(static_cast<double>(t + 1), 0.8));
    const size_t df = static_cast<size_t>(std::min<double>(want, docs));
    std::vector<uint32_t> ds;
    ds.reserve(df);
    for (size_t i = 0; i < df; ++i) ds.push_back(pick(rng));
    std::sort(ds.begin(), ds.end());
    ds.erase(std::unique(ds.begin(), ds.end()), ds.end());
    r.terms.emplace_back(SynthWord(t), std::move(ds));
  }
  return r;
}

std::string IndexWordNet(const std::string& dir, RawIndex* out) {
  std::map<std::string, std::vector<uint32_t>> post;
  uint32_t doc = 0;
  int files = 0;
  for (const char* part : {"noun", "verb", "adj", "adv"}) {
    const std::string path = dir + "/data." + part;
    std::ifstream in(path);
    if (!in) continue;
    ++files;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == ' ') continue;  // license header lines start with spaces
      const auto bar = line.find(" | ");
      if (bar == std::string::npos) continue;
      std::set<std::string> words;
      for (auto& w : Tokenize(std::string_view(line).substr(bar + 3)))
        if (!IsStopWord(w)) words.insert(w);
      if (words.empty()) continue;
      for (const auto& w : words) post[w].push_back(doc);
      ++doc;
    }
  }
  if (files == 0) return "no WordNet data files (data.noun, ...) in " + dir;
  if (doc == 0) return "no glosses found in the WordNet files of " + dir;
  out->num_docs = doc;
  out->terms.clear();
  for (auto& [w, ds] : post) out->terms.emplace_back(w, std::move(ds));
  return "";
}

std::vector<std::vector<std::string>> MakeQueries(const RawIndex& idx, size_t n, uint64_t seed,
                                                  int min_terms, int max_terms) {
  std::vector<size_t> order(idx.terms.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return idx.terms[a].second.size() > idx.terms[b].second.size();
  });
  std::vector<double> weights(order.size());
  for (size_t r = 0; r < order.size(); ++r) weights[r] = 1.0 / static_cast<double>(r + 1);
  std::mt19937_64 rng(seed);
  std::discrete_distribution<size_t> zipf(weights.begin(), weights.end());
  std::uniform_int_distribution<int> len(min_terms, max_terms);
  std::vector<std::vector<std::string>> qs;
  if (order.empty()) return qs;
  qs.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int k = std::min<int>(len(rng), static_cast<int>(order.size()));
    std::set<size_t> chosen;
    while (static_cast<int>(chosen.size()) < k) chosen.insert(order[zipf(rng)]);
    std::vector<std::string> q;
    for (size_t t : chosen) q.push_back(idx.terms[t].first);
    std::shuffle(q.begin(), q.end(), rng);
    qs.push_back(std::move(q));
  }
  return qs;
}

}  // namespace setalgebra
