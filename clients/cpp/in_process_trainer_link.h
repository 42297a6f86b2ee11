// The built-in trainer's way to its worker: straight into a WorkerDaemon in the same process,
// with no serialization and no copy of the gradient or the parameters (trainer_link.h).
//
// Thread-safety: as TrainerLink.
#ifndef TERN_CLIENTS_CPP_IN_PROCESS_TRAINER_LINK_H_
#define TERN_CLIENTS_CPP_IN_PROCESS_TRAINER_LINK_H_

#include <memory>

#include "clients/cpp/trainer_link.h"

namespace tern {

class WorkerDaemon;

// Into `daemon` (which must outlive the link) without leaving the process.
std::unique_ptr<TrainerLink> NewInProcessTrainerLink(WorkerDaemon* daemon);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_IN_PROCESS_TRAINER_LINK_H_
