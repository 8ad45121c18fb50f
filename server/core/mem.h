/*
 * mem.h - the one allocator of the server.
 *
 * The server allocates through these functions, jansson included
 * (mem_install_jansson), so that tests can make the Nth allocation fail and
 * check that each failure is handled cleanly (mem_fail_after, in test builds
 * only: test_hooks.h).  Two modules keep to the C library's allocator for
 * their own structures: the gRPC front end (its server, connections, calls
 * and answers; a request's unpacking and its inputs' bytes come from here,
 * grpc_unpack.c and grpc_infer.c) and the work queue's workers.  They behave
 * like the C library functions they wrap; mem_free accepts NULL.
 */
#ifndef ATTN_MEM_H
#define ATTN_MEM_H

#include <stddef.h>

/* Blocks from this size are mapped on their own by the C library (mem_tune_allocator;
 * glibc caps its own sliding threshold at 32 MiB too). */
#define MEM_MMAP_THRESHOLD ((size_t)32 << 20)

/* A block of MEM_MMAP_THRESHOLD bytes or more, from any of the functions below, is
 * mapped afresh, so each of its pages faults at its first touch, every time such a block
 * is allocated: a kernel's packed K and V, an input's float copy, a result.  They ask
 * for huge pages for it (mem_advise_huge): a fault per 2 MiB instead of per 4 KiB, where
 * faults are dear (a virtual machine's especially). */
void *mem_malloc(size_t size);
void *mem_calloc(size_t count, size_t size);
void *mem_realloc(void *ptr, size_t size);
void mem_free(void *ptr);

/* size bytes at an address that is a multiple of align (a power of two, at least
 * sizeof(void *)), or NULL; freed with mem_free.  For buffers read by vector loads as
 * wide as a cache line. */
void *mem_aligned(size_t align, size_t size);

/* Sets the C library's allocator for a server's repeated large requests, once at start-up:
 * blocks under MEM_MMAP_THRESHOLD come from the heap, and freed heap is kept up to
 * MEM_TRIM_THRESHOLD.  glibc's default maps each block of a few MiB afresh and gives it
 * back when freed, so every request would pay a page fault per 4 KiB of its inputs,
 * scratch and result, which for a mid-sized attention is a large part of its time.  The
 * cost is memory a finished request leaves resident, up to the trim threshold.
 *
 * Arenas: one a CPU (at most MEM_ARENA_MAX) instead of glibc's eight a core.  Each arena's
 * heap is faulted in by the first requests that use it, and with glibc's default the
 * server's workers each take one of their own, so a fresh server's first requests pay
 * thousands of page faults more.  Fewer arenas also keep less freed heap.
 *
 * An operator's own GLIBC_TUNABLES for malloc win: then nothing is changed; with
 * MALLOC_ARENA_MAX set, glibc's reading of it stands.  Returns 1 when the settings were
 * applied. */
int mem_tune_allocator(void);

/* Requests that moved at least this many bytes call mem_give_back when they end. */
#define MEM_GIVE_BACK_FROM ((size_t)1 << 20)

/* Gives freed memory back to the kernel (malloc_trim) when the allocator keeps more of it
 * resident than the trim threshold above what it kept at start-up.  The trim threshold
 * alone does not bound it: it acts only on the top of each heap, while a request that
 * made many small objects (the JSON tree of a large safetensors header) or a large body
 * in a worker's arena leaves free memory in the middle of a heap, which glibc keeps.
 * What is kept is the resident set less the allocator's live bytes (mallinfo2); a call
 * costs a read of /proc/self/statm and a walk of the free lists, and a trim only when
 * the threshold is passed.  Safe from any thread: calls take turns. */
void mem_give_back(void);

/* Asks the kernel to back the 2 MiB-aligned part of the block [ptr, ptr + size)
 * with huge pages (Linux's MADV_HUGEPAGE, which transparent huge pages in
 * their "madvise" mode wait for): a large result written once then costs one
 * page fault per 2 MiB instead of one per 4 KiB.  Only a hint: nothing changes
 * where it is not supported, and the block stays the caller's. */
void mem_advise_huge(void *ptr, size_t size);

/* Makes the whole pages inside [ptr, ptr + size) resident and writable now,
 * without changing what they hold (Linux's MADV_POPULATE_WRITE); from
 * MEM_POPULATE_SPLIT bytes, half of them on a second thread.  For a large
 * buffer about to be written: on a virtual machine whose host takes a guest's
 * free memory back (free page reporting), the first touch of such memory is
 * slow, and two threads touch it in about half the time of one.
 * Returns 0, or -1 when the system cannot, with errno EINVAL from a kernel
 * (or headers) without MADV_POPULATE_WRITE: then nothing was promised, and
 * the pages fault in as they are written, as they would have. */
#define MEM_POPULATE_SPLIT ((size_t)4 << 20)
int mem_populate(void *ptr, size_t size);

/* Gives back to the kernel the whole pages inside [ptr, ptr + size), whose contents the
 * caller will never read again (they read as zeros afterwards; the block stays allocated
 * and the caller's): for a large buffer consumed front to back, such as an uploaded
 * checkpoint turned into arrays, so that what has been read stops counting in the
 * resident set while the rest is still being read.  Only whole pages strictly inside the
 * range are touched, so the allocator's own bookkeeping around the block is not. */
void mem_release(const void *ptr, size_t size);

/* Multiplies a*b*c (pass 1 for unused factors) into *out; returns 0, or -1 when
 * the product overflows size_t.  Used for every size computed from input. */
int mem_mul(size_t a, size_t b, size_t c, size_t *out);

/* Makes jansson allocate through mem_malloc/mem_free, or from the calling
 * thread's JSON arena while one is open. */
void mem_install_jansson(void);

/* The JSON arena of the calling thread, for the tree of one request body.
 * Between mem_json_arena_begin and mem_json_arena_end, every allocation
 * jansson makes on this thread is carved from a few large blocks (taken
 * with mem_malloc, so failure injection reaches them) and freeing it costs
 * nothing; mem_json_arena_end gives the blocks back at once.  Parsing a body
 * of many numbers then costs a pointer bump per value instead of a malloc
 * and a free.  The caller must json_decref every value made in between
 * before mem_json_arena_end (nothing may outlive the arena), and must not
 * nest arenas.  Memory jansson took before the arena opened is freed as
 * usual. */
void mem_json_arena_begin(void);
void mem_json_arena_end(void);

/* size bytes (16-byte aligned) from the calling thread's open JSON arena,
 * given back by mem_json_arena_end; NULL when no arena is open or memory
 * runs out.  A block larger than the arena's blocks gets a block of its own. */
void *mem_json_arena_alloc(size_t size);

/* A number that identifies the arena open on the calling thread (a new one
 * at each mem_json_arena_begin), or 0 when none is open: what was made in
 * an arena is valid while this number is unchanged. */
unsigned long mem_json_arena_epoch(void);

#endif
