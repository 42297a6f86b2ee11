// libFuzzer target for the join of a striped push (worker/stripe_join.h): the input picks a
// bundle, how many stripes carry it, and the order in which the stripes' streams deliver their
// chunks, end, go away, repeat a chunk or corrupt one. Whatever the order: no crash, the outcome
// is decided at most once, every stream is answered at most once, and when every chunk came
// unharmed and no stream went away early the bundle is the one that was sent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/chunking.h"
#include "kernels/builtin.h"
#include "worker/stripe_join.h"

namespace tern {
namespace {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

struct Member final : StripeMember {
  void JoinDone(const absl::Status&) override {
    if (++told > 1 || answered) std::abort();  // answered twice
    answered = true;
  }
  std::shared_ptr<StripeJoin> join;
  size_t next = 0;  // index into its chunks
  bool ended = false, answered = false;
  int told = 0;
};

v1::TensorBundle MakeBundle(Input& in) {
  const bool large = in.Byte() & 1;  // large enough to stay in place
  const size_t numel = large ? 16384 + in.Byte() * 64 : in.Byte() * 8;
  std::vector<float> x(numel);
  for (size_t i = 0; i < numel; ++i) x[i] = static_cast<float>(i % 97) * 0.25f;
  v1::TensorBundle b;
  b.set_run_id("r");
  b.set_sender("1");
  v1::NamedTensor* t = b.add_tensors();
  t->set_name("x");
  t->mutable_tensor()->set_codec("none.v1");
  t->mutable_tensor()->set_numel(numel);
  t->mutable_tensor()->set_payload(x.data(), 4 * numel);
  return b;
}

RawChunk Raw(const v1::BundleChunk& c, uint32_t stripes, std::shared_ptr<const void> owner) {
  RawChunk r;
  r.header = {c.stream_id(), c.offset(),       c.total_size(), c.data_crc32(),
              c.last(),      c.bundle_crc32(), stripes};
  r.owner = std::move(owner);
  if (!c.data().empty()) r.data = {c.data()};
  r.data_size = c.data().size();
  r.message_size = c.ByteSizeLong();
  return r;
}

}  // namespace
}  // namespace tern

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  static const std::unique_ptr<CodecRegistry> codecs = NewBuiltinCodecRegistry();
  Input in(data, size);
  const uint32_t k = 2 + in.Byte() % 4;
  const size_t chunk_bytes = 64 + size_t{in.Byte()} * 64;
  const v1::TensorBundle sent = MakeBundle(in);
  auto chunks = std::make_shared<std::vector<v1::BundleChunk>>(*ChunkBundle(sent, 5, chunk_bytes));
  int outcomes = 0;
  bool got_sent = false;
  StripeJoins joins(
      codecs.get(), 1 << 20,
      [&](const std::string&, absl::StatusOr<ReceivedBundle> got, uint64_t, PayloadScans*) {
        if (++outcomes > 1) std::abort();  // decided twice
        if (!got.ok()) return got.status();
        for (size_t i = 0; i < got->in_place.size(); ++i) {
          if (got->in_place[i].empty()) continue;
          got->bundle.mutable_tensors(static_cast<int>(i))
              ->mutable_tensor()
              ->set_payload(got->in_place[i].Flatten());
        }
        got_sent = got->bundle.SerializeAsString() == sent.SerializeAsString();
        return absl::OkStatus();
      });
  std::vector<Member> m(k);
  std::vector<std::vector<size_t>> mine(k);  // chunk indices of each stripe
  for (size_t i = 0; i < chunks->size(); ++i) mine[i % k].push_back(i);
  bool harmed = false;
  const auto answer = [&](Member& who, const std::optional<absl::Status>& out) {
    if (!out.has_value()) return;
    if (who.answered) std::abort();
    who.answered = true;
  };
  // Delivers stripe j's next chunk (or a changed copy): the daemon's Striped().
  const auto deliver = [&](uint32_t j, int change, uint8_t where) {
    Member& who = m[j];
    if (who.answered || who.ended || who.next >= mine[j].size()) return;
    const v1::BundleChunk& c = (*chunks)[mine[j][who.next]];
    if (change == 2 && who.next == 0) change = 0;  // nothing to repeat yet
    const v1::BundleChunk& pick = change == 2 ? (*chunks)[mine[j][who.next - 1]] : c;
    RawChunk raw = Raw(pick, k, chunks);
    if (change == 1) {  // a flipped bit, or a shifted offset
      auto copy = std::make_shared<v1::BundleChunk>(pick);
      if (!copy->data().empty() && (where & 1)) {
        (*copy->mutable_data())[where % copy->data().size()] ^= 0x20;
      } else {
        copy->set_offset(copy->offset() + 1 + where);
      }
      raw = Raw(*copy, k, copy);
    }
    harmed |= change != 0;
    if (change != 2) ++who.next;
    if (who.join == nullptr) {
      absl::StatusOr<std::shared_ptr<StripeJoin>> join = joins.Attach("peer", raw.header);
      if (!join.ok()) {
        harmed = true;
        who.answered = true;  // refused alone
        return;
      }
      who.join = *join;
    }
    answer(who, who.join->Add(std::move(raw)));
  };
  while (!in.empty()) {
    const uint8_t op = in.Byte();
    const uint32_t j = op % k;
    Member& who = m[j];
    switch ((op / k) % 8) {
      case 0:
      case 1:
      case 2:
      case 3:
        deliver(j, 0, 0);
        break;
      case 4:
        deliver(j, 1, in.Byte());
        break;
      case 5:
        deliver(j, 2, 0);
        break;
      case 6:  // the stream ends its reads, maybe early
        if (who.join != nullptr && !who.answered && !who.ended) {
          harmed |= who.next < mine[j].size();
          who.ended = true;
          answer(who, who.join->EndOfStream(&who));
        }
        break;
      case 7:  // cancelled
        if (who.join != nullptr && !who.answered) {
          harmed = true;
          if (who.join->Leave(&who, absl::CancelledError("fuzz"))) who.answered = true;
        }
        break;
    }
  }
  // The rest in turn, as a sender would.
  for (bool more = true; more;) {
    more = false;
    for (uint32_t j = 0; j < k; ++j) {
      if (!m[j].answered && !m[j].ended && m[j].next < mine[j].size()) {
        deliver(j, 0, 0);
        more = true;
      }
    }
  }
  for (uint32_t j = 0; j < k; ++j) {
    if (m[j].join != nullptr && !m[j].answered && !m[j].ended) {
      m[j].ended = true;
      answer(m[j], m[j].join->EndOfStream(&m[j]));
    }
  }
  if (!harmed && (outcomes != 1 || !got_sent)) std::abort();  // lost or changed on the way
  for (Member& who : m) {
    if (who.join != nullptr) who.join->Leave(&who, absl::CancelledError("done"));
  }
  return 0;
}
