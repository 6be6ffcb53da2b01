/* LD_PRELOAD shim: the disk under one file returns EIO (tests of issue 39, item 1).
 *
 * Every read of a file descriptor whose path ends with $SCALETRAIN_EIO_SUFFIX fails with EIO,
 * and a memory map of it is backed by pages that are gone, so touching it raises SIGBUS:
 * what the kernel does when a mapped page cannot be read from a failing disk. Other files
 * behave as usual.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int faulty(int fd) {
    const char *want = getenv("SCALETRAIN_EIO_SUFFIX");
    char link[64], target[4096];
    if (want == NULL || *want == '\0' || fd < 0)
        return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return 0;
    target[n] = '\0';
    size_t len = strlen(want);
    return (size_t)n >= len && strcmp(target + n - len, want) == 0;
}

#define REAL(name) static __typeof__(name) *real_##name; \
    if (real_##name == NULL) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

ssize_t read(int fd, void *buf, size_t count) {
    REAL(read);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real_read(fd, buf, count);
}

ssize_t pread(int fd, void *buf, size_t count, off_t offset) {
    REAL(pread);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real_pread(fd, buf, count, offset);
}

ssize_t pread64(int fd, void *buf, size_t count, off_t offset) {
    REAL(pread64);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real_pread64(fd, buf, count, offset);
}

ssize_t readv(int fd, const struct iovec *iov, int iovcnt) {
    REAL(readv);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real_readv(fd, iov, iovcnt);
}

ssize_t preadv(int fd, const struct iovec *iov, int iovcnt, off_t offset) {
    REAL(preadv);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real_preadv(fd, iov, iovcnt, offset);
}

ssize_t preadv64(int fd, const struct iovec *iov, int iovcnt, off_t offset) {
    REAL(preadv64);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real_preadv64(fd, iov, iovcnt, offset);
}

ssize_t preadv2(int fd, const struct iovec *iov, int iovcnt, off_t offset, int flags) {
    REAL(preadv2);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real_preadv2(fd, iov, iovcnt, offset, flags);
}

ssize_t preadv64v2(int fd, const struct iovec *iov, int iovcnt, off_t offset, int flags) {
    REAL(preadv64v2);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real_preadv64v2(fd, iov, iovcnt, offset, flags);
}

static void *gone(void *addr, size_t len, int prot, int flags) {
    /* a mapping of a file truncated after mapping: its pages raise SIGBUS when touched */
    REAL(mmap);
    char name[] = "/tmp/scaletrain-eio-XXXXXX";
    int tmp = mkstemp(name);
    if (tmp < 0)
        return MAP_FAILED;
    unlink(name);
    void *p = MAP_FAILED;
    if (ftruncate(tmp, (off_t)len) == 0)
        p = real_mmap(addr, len, prot, flags, tmp, 0);
    if (ftruncate(tmp, 0) != 0) { /* the mapping stays readable: the test then fails */ }
    close(tmp);
    return p;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset) {
    REAL(mmap);
    if (faulty(fd))
        return gone(addr, len, prot, flags);
    return real_mmap(addr, len, prot, flags, fd, offset);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t offset) {
    REAL(mmap64);
    if (faulty(fd))
        return gone(addr, len, prot, flags);
    return real_mmap64(addr, len, prot, flags, fd, offset);
}
