#include "worker/algorithm.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/algorithms/algorithms.h"

namespace tern {

size_t GossipMessage::PayloadBytes() const {
  size_t n = 0;
  for (const auto& [name, t] : parts) n += t.ByteSize();
  return n;
}

const EncodedTensor* GossipMessage::Find(absl::string_view name) const {
  for (const auto& [n, t] : parts) {
    if (n == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<OuterDelay> ParseOuterDelay(absl::string_view name) {
  for (OuterDelay d : {OuterDelay::kNone, OuterDelay::kDelayed, OuterDelay::kEager}) {
    if (name == OuterDelayName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("outer delay '", name, "': expected none, delayed or eager"));
}

absl::string_view OuterDelayName(OuterDelay delay) {
  switch (delay) {
    case OuterDelay::kDelayed:
      return "delayed";
    case OuterDelay::kEager:
      return "eager";
    case OuterDelay::kNone:
      break;
  }
  return "none";
}

namespace {

absl::Status CheckOptions(const AlgorithmOptions& o) {
  if (o.momentum < 0 || o.momentum >= 1) {
    return absl::InvalidArgumentError(absl::StrCat("momentum must be in [0, 1), got ", o.momentum));
  }
  if (o.consensus_step <= 0 || o.consensus_step > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("consensus step must be in (0, 1], got ", o.consensus_step));
  }
  if (o.local_steps < 1) return absl::InvalidArgumentError("local_steps must be >= 1");
  if (!(o.merge_alpha >= 0 && o.merge_alpha < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("merge alpha must be in [0, 1), got ", o.merge_alpha));
  }
  if (o.workers < 1) return absl::InvalidArgumentError("workers must be >= 1");
  return absl::OkStatus();
}

// Algorithms other than CHOCO send the model (and momentum) itself, with no error compensation:
// a lossy codec's error lands in x every round and accumulates (DecentLaM with top-k 1 %
// trains to 45 % where fp16 gets 84 %). Only near-exact codecs keep them converging; CHOCO's
// x-hat copies absorb any compressor's error (ALGORITHMS.md, compressed gossip).
absl::Status CheckCodecFor(absl::string_view algorithm, const AlgorithmOptions& o,
                           const CodecRegistry* codecs) {
  TERN_RETURN_IF_ERROR(codecs->Create(o.codec).status());
  // CHOCO's copies absorb a compressor's error; diloco's error feedback carries it to the next
  // round.
  if (algorithm == "choco" || algorithm == "diloco") return absl::OkStatus();
  const std::string name = o.codec.substr(0, o.codec.find(':'));
  for (const char* exact : {"none", "fp16", "bf16", "int8"}) {
    if (name == exact) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(algorithm,
                   " sends the model itself, so its codec must be near-exact (none, fp16, bf16, "
                   "int8); '",
                   o.codec,
                   "' would compound its error every round: use --algorithm=choco for "
                   "compressed gossip"));
}

// A factory for algorithm `name`, made by `make`; the options and the codec are checked here, so
// a bad one fails at creation rather than at Init.
AlgorithmRegistry::Factory Make(const char* name,
                                std::unique_ptr<Algorithm> (*make)(const AlgorithmOptions&,
                                                                   const CodecRegistry*)) {
  return [name, make](SpecParams&, const AlgorithmOptions& o,
                      const CodecRegistry* codecs) -> absl::StatusOr<std::unique_ptr<Algorithm>> {
    TERN_RETURN_IF_ERROR(CheckOptions(o));
    TERN_RETURN_IF_ERROR(CheckCodecFor(name, o, codecs));
    if (o.outer_delay != OuterDelay::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat("--outer_delay=", OuterDelayName(o.outer_delay), " delays diloco's outer ",
                       "step; ", name, " takes none"));
    }
    if (o.local_steps_max > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--local_steps_max moves diloco's H with the group's agreement; ", name, " keeps its H"));
    }
    return make(o, codecs);
  };
}

}  // namespace

std::unique_ptr<AlgorithmRegistry> NewBuiltinAlgorithmRegistry() {
  return NewBuiltinAlgorithmRegistry(NewBuiltinOuterOptimizerRegistry());
}

std::unique_ptr<AlgorithmRegistry> NewBuiltinAlgorithmRegistry(
    std::shared_ptr<const OuterOptimizerRegistry> outers) {
  auto r = std::make_unique<AlgorithmRegistry>("algorithm");
  AlgorithmRegistry::Factory diloco =
      [outers](SpecParams&, const AlgorithmOptions& o,
               const CodecRegistry* codecs) -> absl::StatusOr<std::unique_ptr<Algorithm>> {
    TERN_RETURN_IF_ERROR(CheckOptions(o));
    TERN_RETURN_IF_ERROR(CheckCodecFor("diloco", o, codecs));
    if (o.keep_overlap && (o.merge_alpha != 0 || o.outer_delay != OuterDelay::kNone)) {
      return absl::InvalidArgumentError(
          "--keep_overlap puts the steps since the send back on the outer model: it replaces "
          "--merge_alpha and has no local model to keep with --outer_delay");
    }
    if (o.outer_delay != OuterDelay::kNone && o.merge_alpha != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--outer_delay=", OuterDelayName(o.outer_delay),
          " starts every round from the outer model, so there is no local model to merge: drop "
          "--merge_alpha"));
    }
    if (o.fragments_min > 0 && o.local_steps_max == 0) {
      return absl::InvalidArgumentError(
          "--fragments_min moves the fragment count with H: give --local_steps_max (as large as "
          "--local_steps keeps H fixed)");
    }
    if (o.local_steps_max > 0) {
      if (o.local_steps_min < 1 || o.local_steps_min > o.local_steps ||
          o.local_steps > o.local_steps_max ||
          o.local_steps_max > static_cast<int>(kMaxLocalSteps)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--local_steps_min=", o.local_steps_min, " <= --local_steps=", o.local_steps,
            " <= --local_steps_max=", o.local_steps_max, " <= ", kMaxLocalSteps,
            " does not hold: H starts at --local_steps and moves within the range"));
      }
      if (o.fragments_min > 0 && (o.fragments_max < 2 || o.fragments_min > o.fragments_max ||
                                  o.fragments_max > static_cast<int>(kMaxFragments))) {
        return absl::InvalidArgumentError(
            absl::StrCat("--fragments_min=", o.fragments_min, " <= --fragments=", o.fragments_max,
                         " <= ", kMaxFragments,
                         " with --fragments > 1 does not hold: the fragment count moves from "
                         "--fragments down as far as --fragments_min"));
      }
      if (o.outer_delay != OuterDelay::kNone) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--local_steps_max: --outer_delay=", OuterDelayName(o.outer_delay),
            " mixes each round at the next exchange, which a change of H would move; keep H "
            "fixed with it"));
      }
    }
    absl::StatusOr<std::unique_ptr<OuterOptimizer>> outer = outers->Create(o.outer);
    if (!outer.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("diloco's outer optimizer '", o.outer, "': ", outer.status().message()));
    }
    return NewDiloco(o, codecs, std::move(*outer));
  };
  const std::pair<const char*, AlgorithmRegistry::Factory> all[] = {
      {"dpsgd", Make("dpsgd", NewDpsgd)},
      {"dmsgd", Make("dmsgd", NewDmsgd)},
      {"decentlam", Make("decentlam", NewDecentLam)},
      {"heavy-ball", Make("heavy-ball", NewHeavyBall)},
      {"choco", Make("choco", NewChoco)},
      {"local-sgd", Make("local-sgd", NewLocalSgd)},
      {"swarm", Make("swarm", NewSwarm)},
      {"diloco", std::move(diloco)},
  };
  // Distinct names by construction: Register cannot fail here.
  for (const auto& [name, factory] : all) (void)r->Register(name, factory);
  return r;
}

}  // namespace tern
