// Bit-level writer and bounds-checked reader for the variable-length codes (Elias gamma, Rice /
// Golomb, fixed-width fields). Bit order: bit i of the stream is bit (i % 8) of byte i / 8, i.e.
// LSB-first; a w-bit field is stored least-significant bit first. docs/wire-format.md §Bitstreams.
//
// Thread-safety: instances are not thread-safe.
#ifndef TERN_COMMON_BIT_IO_H_
#define TERN_COMMON_BIT_IO_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace tern {

class BitWriter {
 public:
  // Appends to `out` (not owned; must outlive the writer). Call Finish() before reading `out`.
  explicit BitWriter(std::string* out) : out_(out) {}

  // Appends the low `n` bits of `v`, n <= 32.
  void Write(uint64_t v, int n) {
    acc_ |= (n == 0 ? 0 : (v & ((uint64_t{1} << n) - 1))) << fill_;
    fill_ += n;
    if (fill_ >= 32) Spill();
  }
  // Appends `n` zero bits followed by a one bit (the unary prefix of gamma and Rice codes).
  void WriteUnary(uint64_t n) {
    while (n >= 32) {
      Write(0, 32);
      n -= 32;
    }
    Write(uint64_t{1} << n, static_cast<int>(n) + 1);
  }
  // Elias gamma code of v >= 1: N = floor(log2 v) zero bits, a one bit, then the low N bits of v.
  void WriteGamma(uint64_t v) {
    const int n = 63 - std::countl_zero(v);
    WriteUnary(n);
    if (n > 32) {
      Write(v, 32);
      Write(v >> 32, n - 32);
    } else {
      Write(v, n);
    }
  }
  // Rice code (Golomb with M = 2^b): quotient v >> b in unary, then the low b bits of v.
  void WriteRice(uint64_t v, int b) {
    WriteUnary(v >> b);
    Write(v, b);
  }
  // Flushes the partial byte (zero padded). Returns the number of bits written before padding.
  uint64_t Finish() {
    const uint64_t total = total_bits();
    while (fill_ > 0) {
      out_->push_back(static_cast<char>(acc_ & 0xff));
      acc_ >>= 8;
      fill_ = fill_ > 8 ? fill_ - 8 : 0;
    }
    bits_ = total;
    return total;
  }
  // Bits written so far, including those still buffered.
  uint64_t total_bits() const { return bits_ + fill_; }

 private:
  void Spill() {
    const uint32_t word = static_cast<uint32_t>(acc_);
    char buf[4];
    std::memcpy(buf, &word, 4);
    out_->append(buf, 4);
    acc_ >>= 32;
    fill_ -= 32;
    bits_ += 32;
  }
  std::string* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;       // valid bits in acc_, < 32 between calls
  uint64_t bits_ = 0;  // bits already spilled to out_
};

// Reads a bitstream of exactly `nbytes` bytes. Every read reports failure (returns false) instead
// of reading past the end; a failed reader stays failed.
class BitReader {
 public:
  BitReader(const uint8_t* data, size_t nbytes) : data_(data), nbits_(uint64_t{nbytes} * 8) {}

  uint64_t position() const { return pos_; }
  uint64_t remaining() const { return nbits_ - pos_; }

  // Reads `n` <= 57 bits into *v.
  bool Read(int n, uint64_t* v) {
    if (static_cast<uint64_t>(n) > remaining()) return false;
    *v = Peek() & (n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1);
    pos_ += n;
    return true;
  }
  // Counts zero bits up to the next one bit, consumes both. Fails if the stream ends first or the
  // count exceeds `max_zeros`.
  bool ReadUnary(uint64_t max_zeros, uint64_t* zeros) {
    uint64_t count = 0;
    for (;;) {
      if (remaining() == 0) return false;
      const uint64_t avail = remaining() < 57 ? remaining() : 57;
      const uint64_t window = Peek() & ((uint64_t{1} << avail) - 1);
      if (window != 0) {
        const int tz = std::countr_zero(window);
        count += tz;
        if (count > max_zeros) return false;
        pos_ += tz + 1;
        *zeros = count;
        return true;
      }
      count += avail;
      pos_ += avail;
      if (count > max_zeros) return false;
    }
  }
  // Elias gamma, rejecting values with more than `max_bits` significant bits (max_bits <= 63).
  bool ReadGamma(int max_bits, uint64_t* v) {
    uint64_t n;
    if (!ReadUnary(static_cast<uint64_t>(max_bits - 1), &n)) return false;
    uint64_t low = 0, high = 0;
    if (n > 32) {
      if (!Read(32, &low) || !Read(static_cast<int>(n) - 32, &high)) return false;
      low |= high << 32;
    } else if (!Read(static_cast<int>(n), &low)) {
      return false;
    }
    *v = (uint64_t{1} << n) | low;
    return true;
  }
  // Rice code with parameter b; the quotient may not exceed `max_quotient`.
  bool ReadRice(int b, uint64_t max_quotient, uint64_t* v) {
    // Most codes lie within one window: one load instead of two (STC's positions, per message).
    const uint64_t avail = remaining() < 57 ? remaining() : 57;
    const uint64_t window = Peek() & ((uint64_t{1} << avail) - 1);
    if (window != 0) {
      const uint64_t tz = static_cast<uint64_t>(std::countr_zero(window));
      if (tz + 1 + static_cast<uint64_t>(b) <= avail) {
        if (tz > max_quotient) return false;
        *v = (tz << b) | ((window >> (tz + 1)) & ((uint64_t{1} << b) - 1));
        pos_ += tz + 1 + static_cast<uint64_t>(b);
        return true;
      }
    }
    uint64_t q, r;
    if (!ReadUnary(max_quotient, &q) || !Read(b, &r)) return false;
    *v = (q << b) | r;
    return true;
  }
  // True when the unread bits are fewer than 8 and all zero (canonical padding).
  bool AtCanonicalEnd() {
    const uint64_t rest = remaining();
    if (rest >= 8) return false;
    uint64_t pad;
    return Read(static_cast<int>(rest), &pad) && pad == 0;
  }

 private:
  // Up to 57 valid bits starting at pos_ (bits past the end read as zero).
  uint64_t Peek() const {
    const uint64_t byte = pos_ >> 3;
    const uint64_t nbytes = nbits_ >> 3;
    uint64_t word = 0;
    if (byte + 8 <= nbytes) {
      std::memcpy(&word, data_ + byte, 8);
    } else if (byte < nbytes) {
      std::memcpy(&word, data_ + byte, nbytes - byte);
    }
    return word >> (pos_ & 7);
  }

  const uint8_t* data_;
  uint64_t nbits_;
  uint64_t pos_ = 0;
};

}  // namespace tern

#endif  // TERN_COMMON_BIT_IO_H_
