// What the call templates in musku/framework.h call: the clock, the handler's deadline, and the
// engine entry points (leaf call mode, responder choice, completion accounting, private waits).
#include <sched.h>
#include <time.h>

#include "engine.h"

namespace musku::detail {

int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {
thread_local std::chrono::system_clock::time_point call_deadline =
    std::chrono::system_clock::time_point::max();
}  // namespace

DeadlineScope::DeadlineScope(std::chrono::system_clock::time_point deadline)
    : saved_(call_deadline) {
  call_deadline = deadline;
}
DeadlineScope::~DeadlineScope() { call_deadline = saved_; }

// ------------------------------------------------------------------------------------------
// Hooks used by the call templates

LeafCallMode CurrentLeafMode(Engine* e) { return e->leaf_mode(); }
LeafTransport LeafTransportOf(Engine* e) { return e->opts().leaf_transport; }
int ResponderCount(Engine* e) { return e->responders_in_use(); }
grpc::CompletionQueue* PickResponderCq(Engine* e, CallBase* call, int n) { return e->PickResponder(call, n); }
void NoteLeafDone(Engine*, grpc::CompletionQueue*) {}
void NoteFinish(Engine* e, CallBase* call, const grpc::Status& status) { e->NoteFinish(call, status); }
void NoteLeafErrors(Engine* e, int n) { e->NoteLeafErrors(n); }
void NotePhase(Engine* e, CallBase* call, Phase p, int64_t wall_ns, int64_t cpu_ns) {
  if (call->counted) e->NotePhase(p, wall_ns, cpu_ns);
}
int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void WaitPrivate(Exec& exec, int n, const std::function<void(Tag*, bool)>& on_tag) {
  grpc::CompletionQueue* cq = exec.private_cq();
  int got = 0;
  while (got < n) {
    void* tag = nullptr;
    bool ok = false;
    if (exec.wait_mode() == WaitMode::kPoll) {
      auto st = cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      if (st == grpc::CompletionQueue::SHUTDOWN) return;
      if (st == grpc::CompletionQueue::TIMEOUT) {
        sched_yield();
        continue;
      }
    } else if (!cq->Next(&tag, &ok)) {
      return;
    }
    ++got;
    on_tag(static_cast<Tag*>(tag), ok);
  }
}

}  // namespace musku::detail

namespace musku {
std::chrono::system_clock::time_point CallDeadline() { return detail::call_deadline; }
}  // namespace musku
