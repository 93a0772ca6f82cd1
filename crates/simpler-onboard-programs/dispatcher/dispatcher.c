/*
 * simpler's bootstrap dispatcher for the AICPU of an Ascend A2/A3 chip.
 *
 * CANN's AICPU framework (libaicpu_extend_kernels.so) loads this small shared object and looks
 * up three entries by name. Only DynTileFwkBackendKernelServerInit does work: it installs
 * simpler's AICPU program, which the host uploaded to device memory, as a file the framework can
 * load afterwards. The protocol, the argument layout and the file naming are described in
 * docs/onboard-programs.md.
 *
 * Everything here is plain C99 plus POSIX file calls so that the same source builds with the
 * AICPU cross compiler and, for the tests, with the host compiler. The install directory is a
 * compile-time setting (SIMPLER_DISPATCHER_INSTALL_DIR) so host tests can point it at a
 * temporary directory.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SIMPLER_DISPATCHER_INSTALL_DIR
#define SIMPLER_DISPATCHER_INSTALL_DIR "/usr/lib64/aicpu_kernels/0/aicpu_kernels_device"
#endif

#define SIMPLER_EXPORT __attribute__((visibility("default")))

/* Byte offsets of the private argument blocks (see docs/onboard-programs.md). */
enum {
    KERNEL_ARGS_DEVICE_ARGS = 40,
    DEVICE_ARGS_DISPATCHER_ADDR = 96,
    DEVICE_ARGS_DISPATCHER_LEN = 104,
    DEVICE_ARGS_DEVICE_ID = 112,
    DEVICE_ARGS_PROGRAM_ADDR = 120,
    DEVICE_ARGS_PROGRAM_LEN = 128,
};

/* Return codes of the init entry; 0 is success. Mirrored by the host crate. */
enum {
    DISPATCH_OK = 0,
    DISPATCH_NULL_ARGS = -1,
    DISPATCH_NULL_DEVICE_ARGS = -2,
    DISPATCH_NO_PROGRAM = -3,
    DISPATCH_PROGRAM_TOO_LARGE = -4,
    DISPATCH_NOT_AN_ELF = -5,
    DISPATCH_PATH_TOO_LONG = -6,
    DISPATCH_CREATE_FAILED = -7,
    DISPATCH_WRITE_FAILED = -8,
    DISPATCH_RENAME_FAILED = -9,
};

/* A program larger than this is refused: the length comes from device memory the host wrote,
 * and a corrupted length must not make the dispatcher write gigabytes. */
#define MAX_PROGRAM_BYTES ((uint64_t)256 << 20)

static uint64_t read_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint32_t read_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint16_t read_u16(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint64_t fnv1a64(const unsigned char *p, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (uint64_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static uint64_t align4(uint64_t v) { return (v + 3) & ~(uint64_t)3; }

/* Finds the GNU build-id note through the program headers of a little-endian ELF64 object.
 * Every offset is bounds-checked against the program's length; returns 1 when found. */
static int find_build_id(const unsigned char *elf, uint64_t len, const unsigned char **id,
                         uint64_t *id_len) {
    if (len < 64 || elf[4] != 2 /* ELFCLASS64 */ || elf[5] != 1 /* little endian */) {
        return 0;
    }
    uint64_t phoff = read_u64(elf + 0x20);
    uint64_t phentsize = read_u16(elf + 0x36);
    uint64_t phnum = read_u16(elf + 0x38);
    if (phentsize < 56 || phoff > len || phnum > (len - phoff) / phentsize) {
        return 0;
    }
    for (uint64_t i = 0; i < phnum; i++) {
        const unsigned char *ph = elf + phoff + i * phentsize;
        if (read_u32(ph) != 4 /* PT_NOTE */) {
            continue;
        }
        uint64_t off = read_u64(ph + 0x08);
        uint64_t size = read_u64(ph + 0x20);
        if (off > len || size > len - off) {
            continue;
        }
        uint64_t pos = 0;
        while (size - pos >= 12) {
            const unsigned char *note = elf + off + pos;
            uint64_t namesz = read_u32(note);
            uint64_t descsz = read_u32(note + 4);
            uint32_t type = read_u32(note + 8);
            uint64_t name_end = 12 + align4(namesz);
            if (name_end > size - pos || align4(descsz) > size - pos - name_end) {
                break;
            }
            if (type == 3 /* NT_GNU_BUILD_ID */ && namesz == 4 && memcmp(note + 12, "GNU", 4) == 0
                && descsz > 0) {
                *id = note + name_end;
                *id_len = descsz;
                return 1;
            }
            pos += name_end + align4(descsz);
        }
    }
    return 0;
}

/* The program's fingerprint: FNV-1a-64 of its GNU build-id, or of its whole content when it has
 * none. */
static uint64_t fingerprint(const unsigned char *program, uint64_t len) {
    const unsigned char *id;
    uint64_t id_len;
    if (find_build_id(program, len, &id, &id_len)) {
        return fnv1a64(id, id_len);
    }
    return fnv1a64(program, len);
}

/* Whether the file at `path` holds exactly `len` bytes equal to `program`. */
static int same_content(const char *path, const unsigned char *program, uint64_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    struct stat st;
    int same = fstat(fd, &st) == 0 && (uint64_t)st.st_size == len;
    unsigned char buf[65536];
    uint64_t done = 0;
    while (same && done < len) {
        ssize_t got = read(fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0 || (uint64_t)got > len - done || memcmp(buf, program + done, (size_t)got) != 0) {
            same = 0;
            break;
        }
        done += (uint64_t)got;
    }
    close(fd);
    return same && done == len;
}

static int write_all(int fd, const unsigned char *p, uint64_t len) {
    while (len > 0) {
        size_t chunk = len > (1u << 20) ? (1u << 20) : (size_t)len;
        ssize_t put = write(fd, p, chunk);
        if (put < 0 && errno == EINTR) {
            continue;
        }
        if (put <= 0) {
            return 0;
        }
        p += put;
        len -= (uint64_t)put;
    }
    return 1;
}

/* Installs the program as <dir>/simpler_inner_<fp>_<device>.so: a fresh temporary file in the
 * same directory, renamed over the target, so a concurrent loader sees the old file or the new
 * one, never a partial one. An identical file is left alone. */
static int install(const unsigned char *program, uint64_t len, uint64_t device) {
    char path[4096];
    char tmp[4096];
    uint64_t fp = fingerprint(program, len);
    int n = snprintf(path, sizeof path, "%s/simpler_inner_%016llx_%llu.so",
                     SIMPLER_DISPATCHER_INSTALL_DIR, (unsigned long long)fp,
                     (unsigned long long)device);
    int m = snprintf(tmp, sizeof tmp, "%s/.simpler_inner_%016llx_%llu.XXXXXX",
                     SIMPLER_DISPATCHER_INSTALL_DIR, (unsigned long long)fp,
                     (unsigned long long)device);
    if (n < 0 || (size_t)n >= sizeof path || m < 0 || (size_t)m >= sizeof tmp) {
        return DISPATCH_PATH_TOO_LONG;
    }
    if (same_content(path, program, len)) {
        return DISPATCH_OK;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) {
        return DISPATCH_CREATE_FAILED;
    }
    int ok = fchmod(fd, 0755) == 0 && write_all(fd, program, len) && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok) {
        unlink(tmp);
        return DISPATCH_WRITE_FAILED;
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return DISPATCH_RENAME_FAILED;
    }
    return DISPATCH_OK;
}

SIMPLER_EXPORT int DynTileFwkBackendKernelServerInit(void *args) {
    if (args == NULL) {
        return DISPATCH_NULL_ARGS;
    }
    uint64_t device_args = read_u64((const unsigned char *)args + KERNEL_ARGS_DEVICE_ARGS);
    if (device_args == 0) {
        return DISPATCH_NULL_DEVICE_ARGS;
    }
    const unsigned char *da = (const unsigned char *)(uintptr_t)device_args;
    uint64_t program_addr = read_u64(da + DEVICE_ARGS_PROGRAM_ADDR);
    uint64_t program_len = read_u64(da + DEVICE_ARGS_PROGRAM_LEN);
    uint64_t device = read_u64(da + DEVICE_ARGS_DEVICE_ID);
    if (program_addr == 0 || program_len == 0) {
        return DISPATCH_NO_PROGRAM;
    }
    if (program_len > MAX_PROGRAM_BYTES) {
        return DISPATCH_PROGRAM_TOO_LARGE;
    }
    const unsigned char *program = (const unsigned char *)(uintptr_t)program_addr;
    if (program_len < 4 || memcmp(program, "\177ELF", 4) != 0) {
        return DISPATCH_NOT_AN_ELF;
    }
    return install(program, program_len, device);
}

/* The framework resolves these two as well; simpler never launches them. They accept any
 * non-null argument and do nothing. */
SIMPLER_EXPORT int StaticTileFwkBackendKernelServer(void *args) {
    return args == NULL ? DISPATCH_NULL_ARGS : DISPATCH_OK;
}

SIMPLER_EXPORT int DynTileFwkBackendKernelServer(void *args) {
    return args == NULL ? DISPATCH_NULL_ARGS : DISPATCH_OK;
}
