// The built-in algorithms, one file each (worker/algorithms/*.cc), made through the registry
// (NewBuiltinAlgorithmRegistry, worker/algorithm.h), which checks the options and the codec first.
#ifndef TERN_WORKER_ALGORITHMS_ALGORITHMS_H_
#define TERN_WORKER_ALGORITHMS_ALGORITHMS_H_

#include <memory>

#include "core/model/outer.h"
#include "kernels/registry.h"
#include "worker/algorithm.h"

namespace tern {

// D-PSGD and DmSGD (D-PSGD with momentum): dpsgd.cc.
std::unique_ptr<Algorithm> NewDpsgd(const AlgorithmOptions& options, const CodecRegistry* codecs);
std::unique_ptr<Algorithm> NewDmsgd(const AlgorithmOptions& options, const CodecRegistry* codecs);
// DecentLaM: decentlam.cc.
std::unique_ptr<Algorithm> NewDecentLam(const AlgorithmOptions& options,
                                        const CodecRegistry* codecs);
// Heavy-ball consensus: heavy_ball.cc.
std::unique_ptr<Algorithm> NewHeavyBall(const AlgorithmOptions& options,
                                        const CodecRegistry* codecs);
// CHOCO-SGD (compressed gossip): choco.cc.
std::unique_ptr<Algorithm> NewChoco(const AlgorithmOptions& options, const CodecRegistry* codecs);
// Local SGD: local_sgd.cc.
std::unique_ptr<Algorithm> NewLocalSgd(const AlgorithmOptions& options,
                                       const CodecRegistry* codecs);
// DiLoCo's outer step within the group, without a server: diloco.cc. `outer` is its outer
// optimizer, made from options.outer.
std::unique_ptr<Algorithm> NewDiloco(const AlgorithmOptions& options, const CodecRegistry* codecs,
                                     std::unique_ptr<OuterOptimizer> outer);
// SwarmSGD: swarm.cc.
std::unique_ptr<Algorithm> NewSwarm(const AlgorithmOptions& options, const CodecRegistry* codecs);

}  // namespace tern

#endif  // TERN_WORKER_ALGORITHMS_ALGORITHMS_H_
