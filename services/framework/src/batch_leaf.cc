// The leaf end of the batch transport: musku.LeafBatch/Stream on a leaf server (batch_leaf.h).
#include "batch_leaf.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "batch.grpc.pb.h"
#include "musku/log.h"

namespace musku::detail {

using Clock = std::chrono::system_clock;

namespace {

class BatchStreamCall;

// One message's calls, run where the leaf's model says.
class BatchJob final : public CallBase {
 public:
  BatchJob(BatchStreamCall* owner, Batch&& in, int64_t arrival) : owner_(owner), in_(std::move(in)) {
    arrival_ns = arrival;
  }
  void Arm(grpc::ServerCompletionQueue*) override {}
  void Run(Exec&) override;

 private:
  BatchStreamCall* owner_;
  Batch in_;
};

class BatchStreamCall final : public StreamCall {
 public:
  BatchStreamCall(LeafBatch::AsyncService* svc, const BatchLeafService* handlers)
      : svc_(svc), handlers_(handlers) {}
  const BatchLeafService& handlers() const { return *handlers_; }

  void Arm(grpc::ServerCompletionQueue* cq) override {
    std::lock_guard<std::mutex> lk(mu_);
    ctx_ = std::make_unique<grpc::ServerContext>();
    rw_ = std::make_unique<grpc::ServerAsyncReaderWriter<Batch, Batch>>(ctx_.get());
    in_.Clear();
    out_.Clear();
    wbuf_.Clear();
    started_ = reading_ = writing_ = read_done_ = closing_ = finishing_ = finished_ = false;
    write_failed_ = false;
    jobs_ = 0;
    svc_->RequestStream(ctx_.get(), rw_.get(), cq, cq, &new_tag);
  }

  void Run(Exec&) override {  // the stream arrived (on its poller)
    engine->StreamStarted(this);
    std::lock_guard<std::mutex> lk(mu_);
    started_ = true;
    reading_ = true;
    rw_->Read(&in_, &read_tag_);
  }

  void OnStreamEvent(Tag::Kind kind, bool ok, Exec& exec) override {
    if (kind == Tag::kRead) return OnRead(ok, exec);
    bool retire;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (writing_) {
        writing_ = false;  // a write came back (kWrite with slot 0)
        if (!ok) {
          write_failed_ = true;
          out_.Clear();
        } else if (out_.items_size() > 0 && !write_failed_) {
          StartWrite();
        }
      } else {
        finished_ = true;  // Finish came back
      }
      retire = MaybeFinish();
    }
    if (retire) engine->Retire(this);
  }

  void JobDone(Batch&& replies) {
    bool retire;
    {
      std::lock_guard<std::mutex> lk(mu_);
      --jobs_;
      if (!write_failed_) {
        if (out_.items_size() == 0)
          out_.Swap(&replies);
        else
          for (auto& r : *replies.mutable_items()) out_.add_items()->Swap(&r);
        if (!writing_ && !finishing_) StartWrite();
      }
      retire = MaybeFinish();
    }
    if (retire) engine->Retire(this);
  }

  // Shutdown: end the stream once the calls already read are answered.
  void Close() override {
    bool retire;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!started_) return;
      closing_ = true;
      retire = MaybeFinish();
    }
    if (retire) engine->Retire(this);
  }

 private:
  void OnRead(bool ok, Exec& exec) {
    BatchJob* job = nullptr;
    bool retire;
    {
      std::lock_guard<std::mutex> lk(mu_);
      reading_ = false;
      if (!ok) {
        read_done_ = true;
      } else {
        const int n = in_.items_size();
        const int64_t now = MonotonicNs();
        engine->NoteArrivals(n, now);
        job = new BatchJob(this, std::move(in_), now);
        in_.Clear();
        ++jobs_;
        if (!closing_ && !finishing_) {
          reading_ = true;
          rw_->Read(&in_, &read_tag_);
        }
      }
      retire = MaybeFinish();
    }
    if (job) engine->RunOrDispatch(job, exec);
    if (retire) engine->Retire(this);
  }

  void StartWrite() {  // under mu_
    wbuf_.Swap(&out_);
    out_.Clear();
    writing_ = true;
    rw_->Write(wbuf_, &write_tag_);
  }

  // Under mu_. Finishes the stream when the client is done (or we are closing) and every job is
  // written; true when the stream's last operation is back and the context may be recycled.
  bool MaybeFinish() {
    if (!finishing_ && (read_done_ || closing_) && jobs_ == 0 && !writing_) {
      finishing_ = true;
      const grpc::Status st = read_done_ ? grpc::Status::OK
                                         : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                        "leaf shutting down");
      rw_->Finish(st, &write_tag_);  // comes back as a kWrite with writing_ false
      return false;
    }
    return finishing_ && finished_ && !reading_ && jobs_ == 0;
  }

  LeafBatch::AsyncService* svc_;
  const BatchLeafService* handlers_;
  std::mutex mu_;
  std::unique_ptr<grpc::ServerContext> ctx_;
  std::unique_ptr<grpc::ServerAsyncReaderWriter<Batch, Batch>> rw_;
  Batch in_, out_, wbuf_;
  Tag read_tag_{Tag::kRead, this, 0};
  Tag write_tag_{Tag::kWrite, this, 0};
  int jobs_ = 0;
  bool started_ = false, reading_ = false, writing_ = false, read_done_ = false, closing_ = false,
       finishing_ = false, finished_ = false, write_failed_ = false;
};

void BatchJob::Run(Exec&) {
  Batch out;
  Engine* e = owner_->engine;
  // The wall-clock time the message was read: each call's deadline is its time left from then.
  const auto read_at = Clock::now() - std::chrono::nanoseconds(MonotonicNs() - arrival_ns);
  for (auto& item : *in_.mutable_items()) {
    auto* r = out.add_items();
    r->set_id(item.id());
    grpc::Status st;
    if (const BatchHandler* h = owner_->handlers().Find(item.method())) {
      // (a year at most: a peer's huge value must not overflow the clock)
      constexpr uint64_t kMaxUs = 365ull * 24 * 3600 * 1000000;
      DeadlineScope scope(item.timeout_us() == 0
                              ? Clock::time_point::max()
                              : read_at + std::chrono::microseconds(
                                              std::min(item.timeout_us(), kMaxUs)));
      const int64_t t0 = MonotonicNs(), c0 = ThreadCpuNs();
      st = (*h)(item.payload(), r->mutable_payload());
      e->NotePhase(kPhaseQueue, t0 - arrival_ns, 0);
      e->NotePhase(kPhaseHandler, MonotonicNs() - t0, ThreadCpuNs() - c0);
    } else
      st = grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no such leaf method");
    if (!st.ok()) {
      r->clear_payload();
      r->set_code(static_cast<int32_t>(st.error_code()));
      r->set_message(st.error_message());
    }
    e->NoteItem(arrival_ns, st.ok());
  }
  BatchStreamCall* owner = owner_;
  delete this;
  owner->JobDone(std::move(out));
}

}  // namespace

BatchLeafService::~BatchLeafService() = default;

void BatchLeafService::AddHandler(uint64_t key, BatchHandler fn) {
  if (!handlers_.emplace(key, std::move(fn)).second)
    LogError("%s: two leaf methods with the same request and reply types; the batch transport "
             "serves the first",
             service_.c_str());
}

const BatchHandler* BatchLeafService::Find(uint64_t key) const {
  auto it = handlers_.find(key);
  return it == handlers_.end() ? nullptr : &it->second;
}

void BatchLeafService::Install(Engine* engine) {
  if (handlers_.empty() || service_impl_) return;
  auto svc = std::make_unique<LeafBatch::AsyncService>();
  LeafBatch::AsyncService* raw = svc.get();
  service_impl_ = std::move(svc);
  engine->RegisterService(raw);
  engine->AddFactory([raw, this] { return std::unique_ptr<CallBase>(new BatchStreamCall(raw, this)); },
                     /*admin=*/true, /*per_cq=*/2);
}

}  // namespace musku::detail
