// Process-wide allocator policy for the daemons; only an executable's main() calls it.
#ifndef TERN_COMMON_ALLOCATOR_H_
#define TERN_COMMON_ALLOCATOR_H_

namespace tern {

// A daemon receives, decodes and frees messages of the same few sizes every round. glibc's
// defaults give each buffer over its (adaptive) mmap threshold fresh pages and return freed heap
// tops to the kernel, so every round pays a page fault and a zeroed page per 4 KiB of every
// message again (half the CPU of a large Gossip.Push was spent so). This keeps freed memory in
// the heap for reuse: buffers up to 32 MiB (glibc's largest threshold) come from the heap, and
// up to 512 MiB of free heap is kept. The cost is that RSS stays at its high-water mark.
void KeepFreedMemoryForReuse();

}  // namespace tern

#endif  // TERN_COMMON_ALLOCATOR_H_
