#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>

#include "index.h"
#include "logic.h"

namespace {

std::vector<uint32_t> RandomSorted(std::mt19937_64& rng, size_t n, uint32_t range) {
  std::set<uint32_t> s;
  std::uniform_int_distribution<uint32_t> d(0, range - 1);
  while (s.size() < n) s.insert(d(rng));
  return {s.begin(), s.end()};
}

std::vector<uint32_t> RefIntersect(std::vector<std::vector<uint32_t>> lists) {
  std::vector<uint32_t> acc = lists[0], tmp;
  for (size_t i = 1; i < lists.size(); ++i) {
    tmp.clear();
    std::set_intersection(acc.begin(), acc.end(), lists[i].begin(), lists[i].end(), std::back_inserter(tmp));
    acc.swap(tmp);
  }
  return acc;
}

std::string TempPath() {
  char p[] = "/tmp/musku-sa-XXXXXX";
  int fd = mkstemp(p);
  close(fd);
  return p;
}

TEST(PostingList, SeekMatchesLowerBound) {
  std::mt19937_64 rng(3);
  for (size_t n : {0, 1, 63, 64, 65, 1000, 20000}) {
    auto docs = RandomSorted(rng, n, 100000);
    setalgebra::PostingList p(docs);
    std::uniform_int_distribution<uint32_t> d(0, 100100);
    for (int i = 0; i < 2000; ++i) {
      size_t from = n ? rng() % n : 0;
      uint32_t target = d(rng);
      auto ref = static_cast<size_t>(std::lower_bound(docs.begin() + static_cast<long>(from), docs.end(), target) - docs.begin());
      ASSERT_EQ(p.Seek(from, target), ref) << "n=" << n << " from=" << from << " target=" << target;
    }
  }
}

TEST(PostingList, IntersectEqualsReference) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int k = 1 + static_cast<int>(rng() % 5);
    std::vector<std::vector<uint32_t>> lists;
    std::vector<setalgebra::PostingList> pls;
    for (int i = 0; i < k; ++i) lists.push_back(RandomSorted(rng, 1 + rng() % 5000, 20000));
    for (auto& l : lists) pls.emplace_back(l);
    std::vector<const setalgebra::PostingList*> ptrs;
    for (auto& p : pls) ptrs.push_back(&p);
    std::vector<uint32_t> got;
    setalgebra::Intersect(ptrs, &got);
    ASSERT_EQ(got, RefIntersect(lists)) << "trial " << trial;
  }
}

// Dense lists (bitmaps, word-wise AND), sparse ones (skip pointers) and mixes, with the ids of
// one shard of a power-of-two shard count (strided bitmaps) and of no shard (plain bitmaps).
TEST(PostingList, BitmapAndMixedIntersectionsEqualReference) {
  std::mt19937_64 rng(12);
  int dense_seen = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const uint32_t stride = (trial % 3 == 0) ? 1 : (trial % 3 == 1 ? 2 : 4);
    const uint32_t residue = static_cast<uint32_t>(rng() % stride);
    const uint32_t universe = 1000 + static_cast<uint32_t>(rng() % 200000);
    const int k = 2 + static_cast<int>(rng() % 4);
    std::vector<std::vector<uint32_t>> lists;
    for (int i = 0; i < k; ++i) {
      const double density = (rng() % 2) ? 0.3 : 0.001 + 0.01 * static_cast<double>(rng() % 10);
      std::vector<uint32_t> l;
      const uint32_t start = static_cast<uint32_t>(rng() % 500);
      for (uint32_t d = start; d < universe; ++d)
        if (d % stride == residue && std::uniform_real_distribution<double>(0, 1)(rng) < density) l.push_back(d);
      if (l.empty()) l.push_back(residue);
      lists.push_back(std::move(l));
    }
    std::vector<setalgebra::PostingList> pls;
    for (auto& l : lists) pls.emplace_back(l, stride);
    std::vector<const setalgebra::PostingList*> ptrs;
    for (auto& p : pls) {
      ptrs.push_back(&p);
      if (p.has_bitmap()) {
        ++dense_seen;
        for (int probe = 0; probe < 50; ++probe) {
          const uint32_t d = static_cast<uint32_t>(rng() % (universe + 100));
          ASSERT_EQ(p.Contains(d), std::binary_search(p.docs().begin(), p.docs().end(), d));
        }
      }
    }
    std::vector<uint32_t> got;
    setalgebra::Intersect(ptrs, &got);
    ASSERT_EQ(got, RefIntersect(lists)) << "trial " << trial << " stride " << stride;
  }
  EXPECT_GT(dense_seen, 200);  // the bitmap paths ran
}

TEST(Index, ShardedQueriesUnionToTheUnshardedReference) {
  auto raw = setalgebra::Synthesize(50000, 400, 5);
  const std::string path = TempPath();
  ASSERT_EQ(setalgebra::WriteIndexFile(path, raw), "");
  std::map<std::string, std::vector<uint32_t>> full(raw.terms.begin(), raw.terms.end());
  const int shards = 3;
  std::vector<setalgebra::Index> idx(shards);
  for (int s = 0; s < shards; ++s) ASSERT_EQ(idx[static_cast<size_t>(s)].Load(path, s, shards), "");
  auto queries = setalgebra::MakeQueries(raw, 300, 9);
  int nonempty = 0;
  for (auto& q : queries) {
    std::vector<std::vector<uint32_t>> lists;
    for (auto& t : q) lists.push_back(full.at(t));
    auto ref = RefIntersect(lists);
    std::set<uint32_t> uni;
    for (auto& i : idx) {
      std::vector<uint32_t> part;
      i.Query(q, &part);
      ASSERT_TRUE(std::is_sorted(part.begin(), part.end()));
      uni.insert(part.begin(), part.end());
    }
    ASSERT_EQ(std::vector<uint32_t>(uni.begin(), uni.end()), ref);
    if (!ref.empty()) ++nonempty;
  }
  EXPECT_GT(nonempty, 30);  // the workload is not trivially empty
  std::vector<uint32_t> none;
  idx[0].Query({"wa", "no-such-term"}, &none);
  EXPECT_TRUE(none.empty());
  std::remove(path.c_str());
}

TEST(IndexFile, TruncatedCorruptAndForeignFilesGiveClearMessages) {
  auto raw = setalgebra::Synthesize(1000, 50, 1);
  const std::string path = TempPath();
  ASSERT_EQ(setalgebra::WriteIndexFile(path, raw), "");
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  setalgebra::RawIndex back;
  ASSERT_EQ(setalgebra::ReadIndexFile(path, &back), "");
  EXPECT_EQ(back.terms, raw.terms);
  auto write = [&](const std::string& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << b;
  };
  write(bytes.substr(0, bytes.size() / 2));
  EXPECT_NE(setalgebra::ReadIndexFile(path, &back).find("truncated"), std::string::npos);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x5a;
  write(flipped);
  EXPECT_NE(setalgebra::ReadIndexFile(path, &back).find("corrupt"), std::string::npos);
  write("hello world, not an index at all");
  EXPECT_NE(setalgebra::ReadIndexFile(path, &back).find("not a Set Algebra index"), std::string::npos);
  std::remove(path.c_str());
  EXPECT_NE(setalgebra::ReadIndexFile(path, &back).find("cannot open"), std::string::npos);
  setalgebra::Index idx;
  EXPECT_NE(idx.Load(path, 0, 1), "");
  EXPECT_NE(idx.Load(path, 2, 2), "");
}

TEST(Text, TokenizeAndStopWords) {
  auto t = setalgebra::Tokenize("The cat's 2 HATS; a-b of x");
  EXPECT_EQ(t, (std::vector<std::string>{"the", "cat", "hats", "of"}));
  EXPECT_TRUE(setalgebra::IsStopWord("the"));
  EXPECT_FALSE(setalgebra::IsStopWord("cat"));
}

TEST(WordNet, IndexesGlossesWithoutStopWords) {
  setalgebra::RawIndex raw;
  std::string why = setalgebra::IndexWordNet("/usr/share/wordnet", &raw);
  if (why.find("no WordNet data files") != std::string::npos) GTEST_SKIP() << why;
  ASSERT_EQ(why, "");
  EXPECT_GT(raw.num_docs, 10000u);
  for (auto& [w, docs] : raw.terms) {
    ASSERT_FALSE(setalgebra::IsStopWord(w)) << w;
    ASSERT_TRUE(std::is_sorted(docs.begin(), docs.end()));
  }
  EXPECT_NE(setalgebra::IndexWordNet("/nonexistent", &raw), "");
}

TEST(Logic, ValidationAndUnion) {
  google::protobuf::RepeatedPtrField<std::string> terms;
  EXPECT_NE(setalgebra::ValidateTerms(terms), "");
  *terms.Add() = "";
  EXPECT_NE(setalgebra::ValidateTerms(terms), "");
  terms.Clear();
  for (int i = 0; i < 65; ++i) *terms.Add() = "x";
  EXPECT_NE(setalgebra::ValidateTerms(terms), "");
  terms.Clear();
  *terms.Add() = "cat";
  EXPECT_EQ(setalgebra::ValidateTerms(terms), "");
  google::protobuf::RepeatedField<uint32_t> a, b, c, out;
  for (uint32_t v : {1, 4, 9}) a.Add(v);
  for (uint32_t v : {2, 4, 10}) b.Add(v);
  setalgebra::UnionSorted({&a, &b, &c}, &out);
  EXPECT_EQ(std::vector<uint32_t>(out.begin(), out.end()), (std::vector<uint32_t>{1, 2, 4, 9, 10}));
}

// End to end over gRPC, in process: two leaves + mid-tier on the framework.
TEST(EndToEnd, MidTierEqualsReferenceAndReportsLeafFailures) {
  auto raw = setalgebra::Synthesize(20000, 300, 8);
  const std::string path = TempPath();
  ASSERT_EQ(setalgebra::WriteIndexFile(path, raw), "");
  std::map<std::string, std::vector<uint32_t>> full(raw.terms.begin(), raw.terms.end());
  setalgebra::Index i0, i1;
  ASSERT_EQ(i0.Load(path, 0, 2), "");
  ASSERT_EQ(i1.Load(path, 1, 2), "");
  setalgebra::LeafLogic l0(&i0, 0), l1(&i1, 1);
  musku::ServerOptions lo;
  lo.service = "setalgebra-leaf";
  setalgebra::Leaf::AsyncService s0, s1;
  musku::Server leaf0(lo, musku::Role::kLeaf), leaf1(lo, musku::Role::kLeaf);
  leaf0.AddLeafMethod(&s0, &setalgebra::Leaf::AsyncService::RequestIntersect, &l0);
  leaf1.AddLeafMethod(&s1, &setalgebra::Leaf::AsyncService::RequestIntersect, &l1);
  std::string err;
  ASSERT_TRUE(leaf0.Start(&err)) << err;
  ASSERT_TRUE(leaf1.Start(&err)) << err;
  std::vector<std::string> addrs = {"127.0.0.1:" + std::to_string(leaf0.port()),
                                    "127.0.0.1:" + std::to_string(leaf1.port())};
  musku::ServerOptions mo;
  mo.service = "setalgebra";
  mo.leaves = addrs;
  mo.leaf_timeout_ms = 500;
  mo.threading = {*musku::ThreadingModel::Parse("async-dispatch-block"), {1, 2, 1}};
  musku::LeafSet<setalgebra::Leaf> leaves(addrs, mo.leaf_timeout_ms);
  setalgebra::MidLogic logic(addrs);
  setalgebra::MidTier::AsyncService ms;
  musku::Server mid(mo, musku::Role::kMidTier);
  mid.AddMidTierMethod(&ms, &setalgebra::MidTier::AsyncService::RequestQuery, &logic, &leaves,
                       &setalgebra::Leaf::Stub::PrepareAsyncIntersect);
  ASSERT_TRUE(mid.Start(&err)) << err;
  auto stub = setalgebra::MidTier::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(mid.port()), grpc::InsecureChannelCredentials()));
  auto queries = setalgebra::MakeQueries(raw, 200, 4);
  for (size_t n = 0; n < queries.size(); ++n) {
    setalgebra::QueryRequest q;
    q.set_id(n);
    std::vector<std::vector<uint32_t>> lists;
    for (auto& t : queries[n]) {
      q.add_terms(t);
      lists.push_back(full.at(t));
    }
    setalgebra::QueryReply r;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Query(&ctx, q, &r).ok());
    ASSERT_EQ(r.id(), n);
    ASSERT_EQ(std::vector<uint32_t>(r.docs().begin(), r.docs().end()), RefIntersect(lists)) << n;
  }
  {  // unknown term: empty, OK
    setalgebra::QueryRequest q;
    q.add_terms("wa");
    q.add_terms("zzzz-unknown");
    setalgebra::QueryReply r;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Query(&ctx, q, &r).ok());
    EXPECT_EQ(r.docs_size(), 0);
  }
  {  // malformed: no terms
    setalgebra::QueryRequest q;
    setalgebra::QueryReply r;
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->Query(&ctx, q, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  leaf1.Shutdown();  // a leaf goes down: error status, not a hang
  {
    setalgebra::QueryRequest q;
    q.add_terms("wa");
    setalgebra::QueryReply r;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto st = stub->Query(&ctx, q, &r);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.error_message().find(addrs[1]), std::string::npos) << st.error_message();
  }
  mid.Shutdown();
  leaf0.Shutdown();
  std::remove(path.c_str());
}

}  // namespace
