// Process-wide allocator policy for the daemons; only an executable's main() calls it.
#ifndef TERN_COMMON_ALLOCATOR_H_
#define TERN_COMMON_ALLOCATOR_H_

namespace tern {

// A daemon receives, decodes and frees messages of the same few sizes every round. An allocator
// that returns freed memory to the kernel makes every round pay a page fault and a zeroed page
// per 4 KiB of every message again (half the CPU of a large Gossip.Push was spent so). The tern
// binary links gperftools' tcmalloc (cli/CMakeLists.txt), which keeps freed spans of every size
// for reuse: a 64 MB push moved 2.4x faster with it than with glibc (docs/benchmarks.md). Under
// glibc's malloc (sanitizer builds, tests) this keeps freed memory in the heap instead: buffers up
// to 32 MiB (glibc's largest mmap threshold; larger ones still get fresh pages) come from the
// heap, and up to 512 MiB of free heap is kept. Either way RSS stays at its high-water mark.
void KeepFreedMemoryForReuse();

}  // namespace tern

#endif  // TERN_COMMON_ALLOCATOR_H_
