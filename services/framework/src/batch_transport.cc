// The batched leaf transport (--leaf-transport batch), mid-tier end: musku.LeafBatch/Stream,
// one long-lived bidirectional stream per mid-tier -> leaf connection.
//
// Leaf calls are queued per leaf; whenever no write is on the wire the queue goes out as one
// message, so a message carries every call that arrived while the previous one was being
// written (no timer, no added latency at low load). One framework thread drives all streams'
// reads, writes and reconnects on its own completion queue; a reply is handed to the thread the
// threading model names by posting the call's tag to that thread's queue with a grpc::Alarm, so
// the eight models behave as with unary calls. Deadlines are kept per call: the driving thread
// fails expired calls with DEADLINE_EXCEEDED (a late reply is dropped), and each call carries
// its time left to the leaf; a broken stream fails its calls with UNAVAILABLE and the next call
// reconnects.
//
// The leaf end is batch_leaf.cc. Neither end needs the other's code, nor this one the engine's.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>
#include <thread>
#include <unordered_map>

#include "batch.grpc.pb.h"
#include "musku/framework.h"

namespace musku::detail {

uint64_t BatchMethodKey(const std::string& request_type, const std::string& reply_type) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char ch : s) {
      h ^= ch;
      h *= 1099511628211ull;
    }
  };
  mix(request_type);
  mix(">");
  mix(reply_type);
  return h;
}

// ------------------------------------------------------------------------------------------
// Mid-tier end

namespace {

using Clock = std::chrono::system_clock;

struct Link;

// One stream's life: its own context and buffers, so that a broken stream's late completions
// never touch its successor. Freed when its last operation has come back.
struct Stream {
  enum Op : uint8_t { kStart, kRead, kWrite, kFinish };
  struct OpTag {
    Stream* s;
    Op op;
  };
  Link* link = nullptr;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<Batch, Batch>> rw;
  Batch rbuf, wbuf;
  grpc::Status status;
  OpTag start_tag{this, kStart}, read_tag{this, kRead}, write_tag{this, kWrite},
      finish_tag{this, kFinish};
  int ops = 0;            // operations outstanding
  bool started = false;   // StartCall came back ok
  bool writing = false;
  bool dead = false;      // broken or cancelled: no new operations
  bool finishing = false; // Finish issued (once, after the last read)
};

struct Link {
  std::mutex mu;
  std::unique_ptr<LeafBatch::Stub> stub;
  Stream* live = nullptr;  // the stream new calls go to (nullptr: connect on the next call)
  Batch out;               // calls queued for the next write
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, BatchTransport::Done> pending;  // sent or queued, not completed
  std::deque<std::pair<Clock::time_point, uint64_t>> expiry;   // deadlines, in send order
};

void Complete(const BatchTransport::Done& d, grpc::Status st) {
  *d.status = std::move(st);
  if (d.cq == nullptr) {  // this thread is the call's response thread
    auto* t = static_cast<Tag*>(d.tag);
    t->call->OnLeafDone(t->slot, true);
    return;
  }
  d.alarm->Set(d.cq, gpr_time_0(GPR_CLOCK_MONOTONIC), d.tag);
}

}  // namespace

struct BatchTransport::Impl {
  std::vector<std::unique_ptr<Link>> links;
  grpc::CompletionQueue cq;
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> messages{0}, calls{0};
  std::mutex streams_mu;
  std::vector<Stream*> streams;  // every stream not yet freed

  // All under link.mu.
  void Connect(Link& l) {
    auto* s = new Stream;
    s->link = &l;
    {
      std::lock_guard<std::mutex> lk(streams_mu);
      streams.push_back(s);
    }
    l.live = s;
    s->rw = l.stub->PrepareAsyncStream(&s->ctx, &cq);
    s->ops = 1;
    s->rw->StartCall(&s->start_tag);
  }
  void StartWrite(Link& l, Stream* s) {
    messages.fetch_add(1, std::memory_order_relaxed);
    calls.fetch_add(static_cast<uint64_t>(l.out.items_size()), std::memory_order_relaxed);
    s->wbuf.Swap(&l.out);
    l.out.Clear();
    s->writing = true;
    ++s->ops;
    s->rw->Write(s->wbuf, &s->write_tag);
  }
  // The stream is broken: fail every call it carries or holds queued; the next call reconnects.
  void Break(Link& l, Stream* s, std::vector<BatchTransport::Done>* failed) {
    if (s->dead) return;
    s->dead = true;
    if (l.live != s) return;
    l.live = nullptr;
    for (auto& [id, d] : l.pending) failed->push_back(d);
    l.pending.clear();
    l.expiry.clear();
    l.out.Clear();
  }
  void MaybeFinish(Stream* s) {  // reap the call's status once nothing else is outstanding
    if (s->dead && !s->finishing && s->ops == 0) {
      s->finishing = true;
      ++s->ops;
      s->rw->Finish(&s->status, &s->finish_tag);
    }
  }

  // Handles one stream event; returns the earliest deadline still pending on its link.
  Clock::time_point OnEvent(Stream::OpTag* t, bool ok) {
    Stream* s = t->s;
    Link& l = *s->link;
    std::vector<BatchTransport::Done> failed;
    std::vector<std::pair<BatchTransport::Done, grpc::Status>> done;
    bool free_it = false;
    Clock::time_point next = Clock::time_point::max();
    {
      std::lock_guard<std::mutex> lk(l.mu);
      --s->ops;
      switch (t->op) {
        case Stream::kStart:
          if (!ok || s->dead) {
            Break(l, s, &failed);
            break;
          }
          s->started = true;
          ++s->ops;
          s->rw->Read(&s->rbuf, &s->read_tag);
          if (l.out.items_size() > 0) StartWrite(l, s);
          break;
        case Stream::kRead:
          if (!ok) {
            Break(l, s, &failed);
            break;
          }
          for (auto& item : *s->rbuf.mutable_items()) {
            auto it = l.pending.find(item.id());
            if (it == l.pending.end()) continue;  // expired already: dropped
            BatchTransport::Done d = it->second;
            l.pending.erase(it);
            if (item.code() == 0) {
              d.payload->swap(*item.mutable_payload());
              done.emplace_back(d, grpc::Status::OK);
            } else {
              done.emplace_back(d, grpc::Status(static_cast<grpc::StatusCode>(item.code()),
                                                item.message()));
            }
          }
          s->rbuf.Clear();
          if (!s->dead) {
            ++s->ops;
            s->rw->Read(&s->rbuf, &s->read_tag);
          }
          break;
        case Stream::kWrite:
          s->writing = false;
          if (!ok) {
            Break(l, s, &failed);
            break;
          }
          s->wbuf.Clear();
          if (!s->dead && l.live == s && l.out.items_size() > 0) StartWrite(l, s);
          break;
        case Stream::kFinish:
          free_it = s->ops == 0;
          break;
      }
      if (t->op != Stream::kFinish) MaybeFinish(s);
      if (!l.expiry.empty()) next = l.expiry.front().first;
    }
    for (auto& d : failed)
      Complete(d, grpc::Status(grpc::StatusCode::UNAVAILABLE, "leaf stream broken"));
    for (auto& [d, st] : done) Complete(d, std::move(st));
    if (free_it) {
      std::lock_guard<std::mutex> lk(streams_mu);
      streams.erase(std::find(streams.begin(), streams.end(), s));
      delete s;
    }
    return next;
  }

  // Fails calls past their deadline; returns the next deadline to wake for (1 s at most).
  Clock::time_point Expire(Clock::time_point now) {
    Clock::time_point next = now + std::chrono::seconds(1);
    for (auto& lp : links) {
      Link& l = *lp;
      std::vector<BatchTransport::Done> expired;
      {
        std::lock_guard<std::mutex> lk(l.mu);
        while (!l.expiry.empty() && l.expiry.front().first <= now) {
          auto it = l.pending.find(l.expiry.front().second);
          l.expiry.pop_front();
          if (it == l.pending.end()) continue;  // answered
          expired.push_back(it->second);
          l.pending.erase(it);
        }
        if (!l.expiry.empty()) next = std::min(next, l.expiry.front().first);
      }
      for (auto& d : expired)
        Complete(d, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "leaf call timed out"));
    }
    return next;
  }

  // Every call sent brings this thread an event on its link soon after (its write or its
  // stream's start completes), so the earliest deadline is always known without scanning the
  // links per event: they are swept only when a deadline is due. An idle transport sleeps.
  void Run() {
    Clock::time_point wake = Clock::now() + std::chrono::seconds(1);
    for (;;) {
      void* tag = nullptr;
      bool ok = false;
      const auto st = cq.AsyncNext(&tag, &ok, wake);
      if (st == grpc::CompletionQueue::SHUTDOWN) return;
      if (st == grpc::CompletionQueue::GOT_EVENT)
        wake = std::min(wake, OnEvent(static_cast<Stream::OpTag*>(tag), ok));
      const auto now = Clock::now();
      if (now >= wake) wake = Expire(now);
    }
  }
};

BatchTransport::BatchTransport(std::vector<std::shared_ptr<grpc::Channel>> channels)
    : impl_(std::make_unique<Impl>()) {
  for (auto& ch : channels) {
    auto l = std::make_unique<Link>();
    l->stub = LeafBatch::NewStub(ch);
    impl_->links.push_back(std::move(l));
  }
  impl_->thread = std::thread([this] { impl_->Run(); });
}

BatchTransport::~BatchTransport() {
  impl_->stopping = true;
  std::vector<Done> failed;
  for (auto& lp : impl_->links) {
    std::lock_guard<std::mutex> lk(lp->mu);
    for (auto& [id, d] : lp->pending) failed.push_back(d);
    lp->pending.clear();
    lp->expiry.clear();
    lp->out.Clear();
  }
  for (auto& d : failed) Complete(d, grpc::Status(grpc::StatusCode::CANCELLED, "mid-tier stopping"));
  for (auto& lp : impl_->links) {  // a stream is live or already dead, reaping itself
    std::lock_guard<std::mutex> lk(lp->mu);
    if (Stream* s = lp->live) {
      lp->live = nullptr;
      s->dead = true;
      s->ctx.TryCancel();
    }
  }
  // Every cancelled stream's operations come back; the last one frees it.
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(impl_->streams_mu);
      if (impl_->streams.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->cq.Shutdown();
  impl_->thread.join();
}

uint64_t BatchTransport::messages() const { return impl_->messages.load(); }
uint64_t BatchTransport::calls() const { return impl_->calls.load(); }

void BatchTransport::Send(int leaf, uint64_t method, const google::protobuf::MessageLite& request,
                          Clock::time_point deadline, const Done& done) {
  if (leaf < 0 || leaf >= static_cast<int>(impl_->links.size()) || impl_->stopping.load()) {
    Complete(done, grpc::Status(grpc::StatusCode::UNAVAILABLE, "no such leaf, or stopping"));
    return;
  }
  Link& l = *impl_->links[static_cast<size_t>(leaf)];
  std::lock_guard<std::mutex> lk(l.mu);
  const uint64_t id = l.next_id++;
  auto* item = l.out.add_items();
  item->set_id(id);
  item->set_method(method);
  request.SerializeToString(item->mutable_payload());
  if (deadline != Clock::time_point::max()) {
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
    item->set_timeout_us(static_cast<uint64_t>(std::max<int64_t>(1, left.count())));
  }
  l.pending.emplace(id, done);
  l.expiry.emplace_back(deadline, id);
  if (l.live == nullptr)
    impl_->Connect(l);
  else if (l.live->started && !l.live->writing)
    impl_->StartWrite(l, l.live);
}

}  // namespace musku::detail
