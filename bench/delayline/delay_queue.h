#ifndef TERN_BENCH_DELAYLINE_DELAY_QUEUE_H_
#define TERN_BENCH_DELAYLINE_DELAY_QUEUE_H_

#include <cstdint>
#include <deque>
#include <optional>

namespace tern::delayline {

// Packets held for a fixed time, released in the order they came: with one delay for every
// packet, arrival order is release order, so a FIFO is the whole schedule and the kernel's
// batch verdict ("every id up to this one") releases them. Times are nanoseconds of a monotonic
// clock the caller reads. A packet that would overflow `capacity` is dropped, as a router's full
// buffer drops it. Popped once every `tick_ns` (0: whenever one is due), a packet is due
// delay - tick/2 after it came, so it is held delay ± tick/2. Not thread-safe: the delay line's
// one loop owns it.
class DelayQueue {
 public:
  DelayQueue(int64_t delay_ns, size_t capacity, int64_t tick_ns = 0)
      : delay_ns_(delay_ns - tick_ns / 2), capacity_(capacity) {}

  // Holds packet `id`, which arrived at `arrived_ns`; false when the queue is full (drop it).
  bool Push(uint32_t id, int64_t arrived_ns) {
    if (held_.size() >= capacity_) {
      ++dropped_;
      return false;
    }
    held_.push_back({id, arrived_ns + delay_ns_});
    if (held_.size() > max_held_) max_held_ = held_.size();
    return true;
  }

  // The last id due at `now_ns`, taking it and every one before it off the queue; none when
  // nothing is due.
  std::optional<uint32_t> PopDue(int64_t now_ns) {
    std::optional<uint32_t> last;
    while (!held_.empty() && held_.front().release_ns <= now_ns) {
      last = held_.front().id;
      held_.pop_front();
      ++released_;
    }
    return last;
  }

  // When the oldest held packet is due; none when nothing is held.
  std::optional<int64_t> NextRelease() const {
    if (held_.empty()) return std::nullopt;
    return held_.front().release_ns;
  }

  // Every held packet, now (shutting down: nothing is left for the kernel to drop).
  std::optional<uint32_t> PopAll() {
    if (held_.empty()) return std::nullopt;
    const uint32_t last = held_.back().id;
    released_ += held_.size();
    held_.clear();
    return last;
  }

  size_t held() const { return held_.size(); }
  size_t max_held() const { return max_held_; }
  uint64_t released() const { return released_; }
  uint64_t dropped() const { return dropped_; }

 private:
  struct Held {
    uint32_t id;
    int64_t release_ns;
  };
  const int64_t delay_ns_;
  const size_t capacity_;
  std::deque<Held> held_;
  size_t max_held_ = 0;
  uint64_t released_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace tern::delayline

#endif  // TERN_BENCH_DELAYLINE_DELAY_QUEUE_H_
