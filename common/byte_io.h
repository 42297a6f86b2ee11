// Little-endian byte writer and bounds-checked reader over (ptr, limit), in the manner of leveldb's
// util/coding.h. The reader never reads past `limit`: every Read* returns false on truncation.
//
// Thread-safety: instances are not thread-safe; distinct instances are independent.
#ifndef TERN_COMMON_BYTE_IO_H_
#define TERN_COMMON_BYTE_IO_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace tern {

// Appends fixed-width little-endian values to a string. x86-64 and aarch64 are little-endian, so a
// memcpy is the encoding; a big-endian port would swap here.
class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Raw(&v, sizeof(v)); }
  void U32(uint32_t v) { Raw(&v, sizeof(v)); }
  void U64(uint64_t v) { Raw(&v, sizeof(v)); }
  void F32(float v) { Raw(&v, sizeof(v)); }
  void Raw(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }

 private:
  std::string* out_;  // not owned
};

// Reads fixed-width little-endian values from [ptr, limit).
class ByteReader {
 public:
  ByteReader(const uint8_t* ptr, const uint8_t* limit) : ptr_(ptr), limit_(limit) {}
  ByteReader(const uint8_t* ptr, size_t n) : ptr_(ptr), limit_(ptr + n) {}

  size_t remaining() const { return static_cast<size_t>(limit_ - ptr_); }
  const uint8_t* ptr() const { return ptr_; }

  bool U8(uint8_t* v) { return Fixed(v); }
  bool U16(uint16_t* v) { return Fixed(v); }
  bool U32(uint32_t* v) { return Fixed(v); }
  bool U64(uint64_t* v) { return Fixed(v); }
  bool F32(float* v) { return Fixed(v); }
  // Returns a pointer to the next `n` bytes and advances past them, or nullptr if fewer remain.
  const uint8_t* Take(size_t n) {
    if (n > remaining()) return nullptr;
    const uint8_t* p = ptr_;
    ptr_ += n;
    return p;
  }

 private:
  template <typename T>
  bool Fixed(T* v) {
    if (sizeof(T) > remaining()) return false;
    std::memcpy(v, ptr_, sizeof(T));
    ptr_ += sizeof(T);
    return true;
  }

  const uint8_t* ptr_;
  const uint8_t* limit_;
};

}  // namespace tern

#endif  // TERN_COMMON_BYTE_IO_H_
