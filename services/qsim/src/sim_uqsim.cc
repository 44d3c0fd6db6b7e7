// μqSim's queue order, for imported μqSim models (docs/qsim.md "Queue kinds", `handoff`).
// Kept apart from the event loop (sim_events.cc calls it once per finished batch of a stage
// whose handoff is "uqsim").
#include <vector>

#include "sim.h"

namespace musku::qsim::internal {

// μqSim's Thread::enqueue (src/thread.cc, commit 78a8957) keeps each stage's queue of a thread
// as a list ordered by the jobs' times. A job that carries a reply (JobRecord WAIT_RESP: the
// request came back to a service it passed through; NodeSpec::reply here) is inserted from the
// head, behind the replies that are not later than it. A request is inserted from the tail:
// it walks back while the job before it is a request whose time is not earlier than its own,
// and lands behind the first reply or earlier request; when the walk reaches the head it lands
// behind the head unless the head is a later request. Every job of a batch finishes at the
// same instant (Stage::run gives them all globalTime + the batch's time), so for the jobs of
// one batch the walk stops at the first job of another time: the batch's requests enter the
// next stage in REVERSE order, and only when the queue was empty and the batch holds no reply
// does its first request stay first (it is the head the later ones land behind). Replies keep
// their order. This reorders `batch` so that appending it to the next stage gives that order.
//
// The order the batch was taken in is μqSim's list order: for a stage that is the first of its
// node, arrival time (an epoll stage takes the first queued job of each connection in list
// order, getJobPerConn), which this engine's ready-connection ring gives only approximately,
// so such a batch is first sorted by arrival. Not modelled: a queue that already holds
// requests when a batch's replies arrive (μqSim puts the replies ahead of them; here they
// queue behind). A one-thread instance drains its later stages first, so its next stage's
// queue is empty whenever a batch finishes.
void Sim::UqsimHandoff(std::vector<Job*>& batch) {
  // No allocation per batch: an insertion sort (batches are a few tens of jobs) and one
  // scratch vector reused across calls.
  static thread_local std::vector<Job*> requests;
  bool first_stage = true;
  for (const Job* j : batch) first_stage = first_stage && j->pos == 0;
  if (first_stage) {  // stable: equal arrival times keep the order the stage took them in
    for (size_t i = 1; i < batch.size(); ++i) {
      Job* j = batch[i];
      size_t k = i;
      for (; k > 0 && batch[k - 1]->node_arrival > j->node_arrival; --k) batch[k] = batch[k - 1];
      batch[k] = j;
    }
  }
  requests.clear();
  size_t replies = 0;
  for (Job* j : batch) {
    if (j->spec->reply) batch[replies++] = j;
    else requests.push_back(j);
  }
  if (requests.empty()) return;
  bool keep_first = false;
  if (replies == 0) {
    const Job* j = requests.front();
    const NodeSpec& n = *j->spec;
    const auto next = static_cast<size_t>(j->pos) + 1;
    keep_first = next >= n.stages.size() ||
                 inst_[static_cast<size_t>(j->inst)].queues[static_cast<size_t>(n.stages[next])].len == 0;
  }
  size_t out = replies;
  if (keep_first) batch[out++] = requests.front();
  for (size_t i = requests.size(); i > (keep_first ? 1U : 0U); --i) batch[out++] = requests[i - 1];
}

}  // namespace musku::qsim::internal
