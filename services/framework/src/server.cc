// musku::Server: the facade services use. It owns the engine, the Admin service and the leaf
// end of the batch transport, and wires them together; the templates in musku/framework.h add
// the services' methods.
#include <pthread.h>
#include <signal.h>

#include "admin.h"
#include "batch_leaf.h"
#include "engine.h"
#include "musku/framework.h"
#include "musku/log.h"

namespace musku {

Server::Server(ServerOptions opts, Role role)
    : engine_(std::make_unique<detail::Engine>(std::move(opts), role)),
      admin_(std::make_unique<detail::AdminService>(engine_.get())),
      batch_(std::make_unique<detail::BatchLeafService>(engine_->opts().service)) {}

Server::~Server() {
  engine_->Shutdown();
  engine_.reset();  // threads joined, contexts freed: now the services' handlers may go
  admin_.reset();
  batch_.reset();
}

void Server::RegisterService(grpc::Service* svc) { engine_->RegisterService(svc); }
void Server::RegisterBatchHandler(uint64_t key, detail::BatchHandler fn) {
  batch_->AddHandler(key, std::move(fn));
}

void Server::AddCallFactory(std::function<std::unique_ptr<detail::CallBase>()> factory) {
  engine_->AddFactory(std::move(factory), false, engine_->opts().contexts_per_cq);
}

bool Server::Start(std::string* error) {
  batch_->Install(engine_.get());  // serves musku.LeafBatch if a leaf method was added
  return engine_->Start(error);
}
void Server::Wait() { engine_->Wait(); }
void Server::Shutdown() { engine_->Shutdown(); }

int Server::Run() {
  std::string err;
  if (!Start(&err)) {
    LogError("%s: %s", engine_->opts().service.c_str(), err.c_str());
    return 1;
  }
  Wait();
  Shutdown();
  LogInfo("%s: stopped", engine_->opts().service.c_str());
  return 0;
}

int Server::port() const { return engine_->port(); }
const ServerOptions& Server::options() const { return engine_->opts(); }
std::string Server::SetThreading(const Threading& t) { return engine_->SetThreading(t); }
std::string Server::SetAuto(const std::string& p) { return engine_->SetAuto(p); }
Threading Server::CurrentThreading() const { return engine_->Current(); }
double Server::MeasuredQps() const { return engine_->MeasuredQps(); }
void Server::SetWorkerChooser(std::function<int(int)> fn) { engine_->SetWorkerChooser(std::move(fn)); }

void Server::BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace musku

