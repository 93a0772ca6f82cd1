/*
 * The stand-in CANN library: written by the simpler project for its tests.
 *
 * It exports every function of symbols.toml with the signature of include/simpler_cann.h
 * (written out here again on purpose: the stand-in must not need CANN headers, and a
 * mismatch shows up as a failing test), plus a control API (standin_*). Nothing runs on a
 * device: device memory is zero-filled host memory with range checks, handles are small
 * integers, launches record their arguments, syncs succeed unless a knob says otherwise.
 *
 * Every call is appended to one ordered log. A test lays out several copies of this object
 * as the libraries of a fake install; each copy is opened RTLD_LOCAL and has its own globals,
 * so the test harness points every copy at the state of the first (standin_share_state) and
 * the log stays one ordered sequence across the libraries. The state is on the heap and
 * counts the copies using it: a copy still loaded (held by a loader that outlived the
 * install) never points into an unloaded one, and the last copy to unload frees it.
 *
 * As CANN does, the stand-in writes a process log when ASCEND_PROCESS_LOG_PATH names a
 * directory: one line per call in <dir>/debug/plog/plog-<pid>_standin.log, so harnesses that
 * collect CANN's logs have something to collect.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* Return codes the stand-in produces. */
#define OK 0
#define E_PARAM 107000           /* ACL_ERROR_RT_PARAM_INVALID */
#define MAX_DEVICES 64
#define E_REPEAT_INIT 100002     /* ACL_ERROR_REPEAT_INITIALIZE */
#define E_REPEAT_FINALIZE 100037 /* ACL_ERROR_REPEAT_FINALIZE */
#define E_SYNC_TIMEOUT 507046    /* ACL_ERROR_RT_STREAM_SYNC_TIMEOUT */
#define E_EVENT_SYNC_TIMEOUT 507047 /* ACL_ERROR_RT_EVENT_SYNC_TIMEOUT */
#define E_DRV_INTERNAL 507899    /* ACL_ERROR_RT_DRV_INTERNAL_ERROR */

#define NAME_LEN 48
#define TEXT_LEN 128
#define MAX_LOG 8192
#define MAX_FAULTS 32
#define MAX_COUNTERS 128
#define MAX_OBJECTS 1024
#define MAX_OPS 16

/* One log entry; the Rust harness reads these with the same layout. -1 (or 0 for a handle)
 * means "not applicable to this function". */
typedef struct standin_call {
    char func[NAME_LEN];
    int64_t device;
    uint64_t stream;
    int64_t block_dim;
    int64_t size;
    int64_t timeout;
    int64_t value;
    char text[TEXT_LEN];
    int64_t ret;
} standin_call;

typedef struct fault {
    char func[NAME_LEN];
    uint64_t nth;   /* 0 = every call */
    int32_t code;
    bool poison;    /* the failing call also poisons the device */
} fault;

typedef struct counter {
    char func[NAME_LEN];
    uint64_t calls;
} counter;

/* OBJ_RETIRED: device memory given back (freed, reset, released with its device) while a live
 * host mapping still covered it; its storage is kept until no live mapping covers it. */
enum object_kind { OBJ_NONE, OBJ_STREAM, OBJ_EVENT, OBJ_MEMORY, OBJ_MAPPING, OBJ_KERNEL_BIN,
                   OBJ_CPU_BIN, OBJ_FUNC, OBJ_COMM, OBJ_RETIRED };

/* An event recorded on a stream the device stopped before reaching it (pending_after_records). */
#define RECORDED_NOT_REACHED 2

typedef struct object {
    enum object_kind kind;
    uint64_t handle;        /* for memory and mappings: the address */
    uint64_t size;          /* memory size; for a stream: its creation index */
    uint64_t owner;         /* a func's binary; an event's last stream */
    int recorded;           /* an event: 0 never recorded, 1 complete, RECORDED_NOT_REACHED */
    int64_t context;        /* memory's, a stream's, an event's or an AICPU binary's device (the
                             * creating thread's) */
    char ops[MAX_OPS][64];  /* a CPU binary's op types; a func's name in ops[0] */
    int nops;
} object;

typedef struct state {
    pthread_mutex_t lock;
    int refs;                  /* copies using this state; the last one to unload frees it */
    int recent_key_created;
    pthread_key_t recent_key;  /* this thread's last failure reason (aclGetRecentErrMsg) */
    int bound_key_created;
    pthread_key_t bound_key;   /* this thread's bound device + 1, shared by every copy */
    standin_call log[MAX_LOG];
    size_t log_len;
    uint64_t log_dropped;
    counter counters[MAX_COUNTERS];
    size_t ncounters;
    fault faults[MAX_FAULTS];
    size_t nfaults;
    object objects[MAX_OBJECTS];
    uint64_t next_handle;
    uint64_t streams_created;
    int poisoned;
    int acl_initialized;
    int after_force_reset;
    /* Per device, as CANN counts them: sets since the device was last released. A reset
     * takes one off and releases the device at 0; a force reset releases it at once; either
     * is refused when the count is already 0. */
    uint32_t set_count[MAX_DEVICES];
    /* knobs (standin_set_value) */
    int64_t sync_timeout_stream;   /* creation index (1-based) whose syncs time out; 0 = none */
    int64_t pending_after_records; /* event records that still complete; later ones stay
                                    * pending (the device stopped there); -1 = all complete */
    int64_t reach_after_syncs;     /* event syncs after which the device goes on again: every
                                    * pending event is reached; -1 = never */
    int64_t sync_delay_stream;     /* creation index (1-based) whose syncs take sync_delay_ms */
    int64_t sync_delay_ms;         /* how long such a sync takes (a timeout shorter than it runs
                                    * out after the timeout instead); 0 = no delay */
    int64_t reset_probe_failures;  /* stream creations right after a force reset that fail */
    int64_t force_reset_delay_ms;  /* how long aclrtResetDeviceForce takes, without the lock */
    int64_t drain_result;
    int64_t cube_core_limit;
    int64_t vector_core_limit;
    int64_t aicpu_occupy_mask;
    int64_t aicore_valid_mask;
    int64_t device_count;
    int64_t version[3];
    int64_t soc_name;              /* index into SOC_NAMES; out of range = no name (NULL) */
    int64_t register_reply;        /* what a register-entry launch answers; see answer_register */
} state;

/* What aclrtGetSocName answers, chosen by the soc_name knob: an A2, an A3, an A5. */
static const char *const SOC_NAMES[] = {"Ascend910B1", "Ascend910_9391", "Ascend950PR_9599"};

/* The state this copy uses: its own until standin_share_state points it at the first copy's.
 * It lives on the heap, so a copy still loaded never points into one that was unloaded. The
 * harness shares the state before the copy can be found at its path, so no call runs on the
 * copy while it changes; the pointer is atomic all the same, so reading it is never a race. */
static state *_Atomic st;
static pthread_once_t own_once = PTHREAD_ONCE_INIT;

/* The device bound on the calling thread, -1 for none. Kept in the shared state, so that a
 * bind through one copy (the runtime's rtSetDevice) holds for calls through another (the ACL
 * library's), as one CANN context does. Called with the lock held. */
static int bound_device_now(void) {
    if (!st->bound_key_created) return -1;
    return (int)(intptr_t)pthread_getspecific(st->bound_key) - 1;
}

/* Non-zero when the bind cannot be recorded (no thread key left). */
static int set_bound_device(int device) {
    if (!st->bound_key_created) {
        if (pthread_key_create(&st->bound_key, NULL) != 0) return -1;
        st->bound_key_created = 1;
    }
    return pthread_setspecific(st->bound_key, (void *)(intptr_t)(device + 1));
}

static void set_defaults(state *s) {
    s->next_handle = 1;
    s->sync_timeout_stream = 0;
    s->pending_after_records = -1;
    s->reach_after_syncs = -1;
    s->sync_delay_stream = 0;
    s->sync_delay_ms = 0;
    s->reset_probe_failures = 0;
    s->force_reset_delay_ms = 0;
    s->drain_result = OK;
    s->cube_core_limit = 24;
    s->vector_core_limit = 48;
    s->aicpu_occupy_mask = 0x3f; /* 6 AICPUs */
    s->aicore_valid_mask = -1;
    s->device_count = 1;
    s->version[0] = 8;
    s->version[1] = 2;
    s->version[2] = 0;
    s->soc_name = 0;
    s->register_reply = 0;
}

static void free_objects(state *s);

static void init_own(void) {
    st = calloc(1, sizeof *st);
    if (st == NULL) abort();
    pthread_mutex_init(&st->lock, NULL);
    st->refs = 1;
    set_defaults(st);
}

static state *S(void) {
    pthread_once(&own_once, init_own);
    return st;
}

/* Drops this copy's reference; the last copy frees the state and its device memory. */
static void release(state *s) {
    pthread_mutex_lock(&s->lock);
    int last = --s->refs == 0;
    pthread_mutex_unlock(&s->lock);
    if (!last) return;
    free_objects(s);
    if (s->recent_key_created) pthread_key_delete(s->recent_key);
    if (s->bound_key_created) pthread_key_delete(s->bound_key);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

__attribute__((destructor)) static void unload(void) {
    if (st != NULL) release(st);
}

/* Called with the lock held. */
static void set_recent(const char *func, int64_t code, const char *why) {
    if (!st->recent_key_created) {
        if (pthread_key_create(&st->recent_key, free) != 0) return;
        st->recent_key_created = 1;
    }
    char *buf = pthread_getspecific(st->recent_key);
    if (buf == NULL) {
        buf = calloc(1, 256);
        if (buf == NULL) return;
        pthread_setspecific(st->recent_key, buf);
    }
    snprintf(buf, 256, "stand-in: %s returned %lld: %s", func, (long long)code, why);
}

static uint64_t count_call(const char *func) {
    for (size_t i = 0; i < st->ncounters; i++) {
        if (strcmp(st->counters[i].func, func) == 0) return ++st->counters[i].calls;
    }
    if (st->ncounters == MAX_COUNTERS) return 0;
    counter *c = &st->counters[st->ncounters++];
    snprintf(c->func, NAME_LEN, "%s", func);
    c->calls = 1;
    return 1;
}

/* A call in progress: filled by the function, appended by finish(). */
typedef struct call {
    standin_call entry;
    int32_t injected; /* non-zero: return this without doing anything */
} call;

/* Locks the state, counts the call and decides whether a knob makes it fail. */
static call begin(const char *func) {
    S();
    pthread_mutex_lock(&st->lock);
    call c;
    memset(&c, 0, sizeof c);
    snprintf(c.entry.func, NAME_LEN, "%s", func);
    c.entry.device = -1;
    c.entry.block_dim = -1;
    c.entry.size = -1;
    c.entry.timeout = -1;
    c.entry.value = -1;
    uint64_t n = count_call(func);
    for (size_t i = 0; i < st->nfaults; i++) {
        fault *f = &st->faults[i];
        if (strcmp(f->func, func) == 0 && (f->nth == 0 || f->nth == n)) {
            c.injected = f->code;
            if (f->poison) st->poisoned = 1;
            set_recent(func, f->code, "injected fault");
            return c;
        }
    }
    if (st->poisoned && strcmp(func, "aclrtResetDeviceForce") != 0 &&
        strcmp(func, "aclGetRecentErrMsg") != 0) {
        c.injected = E_DRV_INTERNAL;
        set_recent(func, E_DRV_INTERNAL, "the device is poisoned until aclrtResetDeviceForce");
    }
    return c;
}

/* Appends the call to the process log under ASCEND_PROCESS_LOG_PATH, if set (best effort). */
static void write_process_log(const standin_call *e) {
    const char *root = getenv("ASCEND_PROCESS_LOG_PATH");
    if (root == NULL || root[0] == '\0') return;
    char path[4096];
    snprintf(path, sizeof path, "%s/debug", root);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/debug/plog", root);
    mkdir(path, 0755);
    int n = snprintf(path, sizeof path, "%s/debug/plog/plog-%ld_standin.log", root, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof path) return;
    FILE *f = fopen(path, "a");
    if (f == NULL) return;
    fprintf(f, "[%s] RUNTIME(%ld) %s: device %lld, return %d\n", e->ret == 0 ? "INFO" : "ERROR",
            (long)getpid(), e->func, (long long)e->device, (int)e->ret);
    fclose(f);
}

static int32_t finish(call *c, int32_t ret) {
    c->entry.ret = ret;
    write_process_log(&c->entry);
    if (st->log_len < MAX_LOG) {
        st->log[st->log_len++] = c->entry;
    } else {
        st->log_dropped++;
    }
    pthread_mutex_unlock(&st->lock);
    return ret;
}

static int32_t fail(call *c, int32_t code, const char *why) {
    set_recent(c->entry.func, code, why);
    return finish(c, code);
}

/* A call on a context's objects from a thread with no device bound: CANN has no context there. */
static int32_t no_context(call *c) {
    return fail(c, 107002, "no device bound on this thread (context is null)");
}

/* ---- objects ---------------------------------------------------------------------------- */

static object *new_object(enum object_kind kind) {
    for (size_t i = 0; i < MAX_OBJECTS; i++) {
        if (st->objects[i].kind == OBJ_NONE) {
            object *o = &st->objects[i];
            memset(o, 0, sizeof *o);
            o->kind = kind;
            o->handle = st->next_handle++;
            return o;
        }
    }
    return NULL;
}

static object *find(enum object_kind kind, uint64_t handle) {
    if (handle == 0) return NULL;
    for (size_t i = 0; i < MAX_OBJECTS; i++) {
        if (st->objects[i].kind == kind && st->objects[i].handle == handle) return &st->objects[i];
    }
    return NULL;
}

/* The live allocation containing [addr, addr + len), or NULL. */
static object *find_range(uint64_t addr, uint64_t len) {
    for (size_t i = 0; i < MAX_OBJECTS; i++) {
        object *o = &st->objects[i];
        if (o->kind == OBJ_MEMORY && addr >= o->handle && len <= o->size &&
            addr - o->handle <= o->size - len) {
            return o;
        }
    }
    return NULL;
}

static int32_t alloc_memory(call *c, void **out, uint64_t size) {
    c->entry.size = (int64_t)size;
    if (out == NULL || size == 0) return fail(c, E_PARAM, "null out-pointer or zero size");
    /* CANN allocates on the calling thread's device: with none bound there is no context. */
    if (bound_device_now() < 0) return no_context(c);
    void *p = NULL;
    if (posix_memalign(&p, 1024, size) != 0) return fail(c, 207001, "host allocation failed");
    memset(p, 0, size);
    object *o = new_object(OBJ_MEMORY);
    if (o == NULL) {
        free(p);
        return fail(c, 207001, "too many objects");
    }
    o->handle = (uint64_t)(uintptr_t)p;
    o->size = size;
    o->context = bound_device_now();
    *out = p;
    c->entry.value = (int64_t)o->handle;
    return finish(c, OK);
}

/* Whether a live host mapping covers any byte of [addr, addr + size). */
static bool mapped(const state *s, uint64_t addr, uint64_t size) {
    for (size_t i = 0; i < MAX_OBJECTS; i++) {
        const object *m = &s->objects[i];
        if (m->kind == OBJ_MAPPING && m->handle < addr + size && addr < m->handle + m->size)
            return true;
    }
    return false;
}

/* Gives an allocation back. A mapping is the identity pointer, so the host may still read the
 * storage through a live one: storage a live mapping covers is kept (retired, no allocation
 * any more) until the last such mapping is unregistered; any other storage is freed now. */
static void release_memory(state *s, object *o) {
    if (mapped(s, o->handle, o->size)) {
        o->kind = OBJ_RETIRED;
        return;
    }
    free((void *)(uintptr_t)o->handle);
    o->kind = OBJ_NONE;
}

/* Frees the retired storage that no live mapping covers any more. */
static void free_unmapped_retired(state *s) {
    for (size_t i = 0; i < MAX_OBJECTS; i++) {
        object *o = &s->objects[i];
        if (o->kind == OBJ_RETIRED && !mapped(s, o->handle, o->size)) {
            free((void *)(uintptr_t)o->handle);
            o->kind = OBJ_NONE;
        }
    }
}

static int32_t free_memory(call *c, void *p) {
    c->entry.value = (int64_t)(uintptr_t)p;
    /* CANN frees in the calling thread's context: with none bound there is none, and in one
     * of another device the allocation is not found. */
    if (bound_device_now() < 0) return no_context(c);
    object *o = find(OBJ_MEMORY, (uint64_t)(uintptr_t)p);
    if (o == NULL) return fail(c, E_PARAM, "not a live allocation");
    if (o->context != bound_device_now())
        return fail(c, E_PARAM, "an allocation of another device's context");
    release_memory(st, o);
    return finish(c, OK);
}

/* kind: 0 host-host, 1 host-device, 2 device-host, 3 device-device (ACL and RTS agree). */
static int32_t copy_memory(call *c, void *dst, uint64_t dest_max, const void *src,
                           uint64_t count, int kind) {
    c->entry.size = (int64_t)count;
    c->entry.value = kind;
    if (count > dest_max) return fail(c, E_PARAM, "count exceeds destMax");
    if (dst == NULL || src == NULL) return fail(c, E_PARAM, "null pointer");
    bool dst_dev = kind == 1 || kind == 3;
    bool src_dev = kind == 2 || kind == 3;
    if (kind < 0 || kind > 3) return fail(c, E_PARAM, "unknown copy kind");
    if (dst_dev && find_range((uint64_t)(uintptr_t)dst, count) == NULL)
        return fail(c, E_PARAM, "destination outside every device allocation");
    if (src_dev && find_range((uint64_t)(uintptr_t)src, count) == NULL)
        return fail(c, E_PARAM, "source outside every device allocation");
    memmove(dst, src, count);
    return finish(c, OK);
}

static int32_t create_stream(call *c, void **out) {
    if (out == NULL) return fail(c, E_PARAM, "null out-pointer");
    if (bound_device_now() < 0) return no_context(c);
    if (st->after_force_reset) {
        st->after_force_reset = 0;
        if (st->reset_probe_failures > 0) {
            st->reset_probe_failures--;
            return fail(c, E_DRV_INTERNAL, "the device is not usable yet after the force reset");
        }
    }
    object *o = new_object(OBJ_STREAM);
    if (o == NULL) return fail(c, E_PARAM, "too many objects");
    o->size = ++st->streams_created;
    o->context = bound_device_now();
    *out = (void *)(uintptr_t)o->handle;
    c->entry.stream = o->handle;
    return finish(c, OK);
}

static int32_t destroy_object(call *c, enum object_kind kind, void *h) {
    /* Streams and events belong to a device's context, as memory does: CANN destroys them in
     * the calling thread's. */
    bool in_context = kind == OBJ_STREAM || kind == OBJ_EVENT;
    if (in_context && bound_device_now() < 0)
        return no_context(c);
    object *o = find(kind, (uint64_t)(uintptr_t)h);
    if (o == NULL) return fail(c, E_PARAM, "not a live handle");
    if (in_context && o->context != bound_device_now())
        return fail(c, E_PARAM, "a handle of another device's context");
    o->kind = OBJ_NONE;
    return finish(c, OK);
}

static void sleep_ms(int64_t ms) {
    if (ms <= 0) return;
    struct timespec left = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    /* A signal cuts a sleep short; sleep on for what it left. */
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {}
}

/* The device's time to finish the work of the stream with creation index `index` before a
 * sync of it with `timeout` (ms; < 0 = none) returns: whether it finished within the timeout.
 * The state lock stays held: syncs of the stand-in are not meant to overlap. */
static bool finish_within(int64_t index, int64_t timeout) {
    if (st->sync_delay_ms <= 0 || index != st->sync_delay_stream) return true;
    bool in_time = timeout < 0 || st->sync_delay_ms <= timeout;
    sleep_ms(in_time ? st->sync_delay_ms : timeout);
    return in_time;
}

static int32_t sync_stream(call *c, void *stream, int64_t timeout) {
    c->entry.stream = (uint64_t)(uintptr_t)stream;
    c->entry.timeout = timeout;
    object *o = find(OBJ_STREAM, c->entry.stream);
    if (o == NULL) return fail(c, E_PARAM, "not a live stream");
    if (!finish_within((int64_t)o->size, timeout))
        return fail(c, E_SYNC_TIMEOUT, "the stream did not finish within the timeout");
    if (st->sync_timeout_stream != 0 && (int64_t)o->size == st->sync_timeout_stream)
        return fail(c, E_SYNC_TIMEOUT, "the stream did not finish within the timeout");
    return finish(c, OK);
}

static int valid_device(int32_t device) {
    return device >= 0 && device < st->device_count && device < MAX_DEVICES;
}

static int32_t bind(call *c, int32_t device) {
    c->entry.device = device;
    if (!valid_device(device)) return fail(c, E_PARAM, "no such device");
    if (set_bound_device(device) != 0) return fail(c, E_DRV_INTERNAL, "cannot record the bind");
    st->set_count[device]++;
    return finish(c, OK);
}

/* A reset: one set off (`force`: all of them), refused when none is left. */
static int32_t reset(call *c, int32_t device, int force) {
    c->entry.device = device;
    if (!valid_device(device)) return fail(c, E_PARAM, "no such device");
    if (st->set_count[device] == 0) {
        return fail(c, E_PARAM, "the device was released already (no set since the last reset)");
    }
    st->set_count[device] = force ? 0 : st->set_count[device] - 1;
    if (force) {
        st->poisoned = 0;
        st->after_force_reset = 1;
        /* The device's memory goes back with it: a later free of it is refused (storage a
         * live host mapping covers is kept until that mapping goes, see release_memory). So do
         * its context's streams, events and AICPU binaries (with their functions): a later
         * destroy or unload of one is refused as not live. */
        for (size_t i = 0; i < MAX_OBJECTS; i++) {
            object *o = &st->objects[i];
            if (o->context != device) continue;
            if (o->kind == OBJ_MEMORY) release_memory(st, o);
            else if (o->kind == OBJ_STREAM || o->kind == OBJ_EVENT || o->kind == OBJ_CPU_BIN)
                o->kind = OBJ_NONE;
        }
        for (size_t i = 0; i < MAX_OBJECTS; i++) {
            object *f = &st->objects[i];
            if (f->kind == OBJ_FUNC && find(OBJ_CPU_BIN, f->owner) == NULL) f->kind = OBJ_NONE;
        }
    }
    return finish(c, OK);
}

/* ---- control API ------------------------------------------------------------------------ */

EXPORT void *standin_state(void) { return S(); }

/* Makes this copy use `other` (the state of the first copy of the same install). */
EXPORT void standin_share_state(void *other) {
    state *mine = S();
    if (other == NULL || other == mine) return;
    state *shared = other;
    pthread_mutex_lock(&shared->lock);
    shared->refs++;
    pthread_mutex_unlock(&shared->lock);
    st = shared;
    release(mine);
}

/* Frees every object with its storage, mapped or not: for the last copy to unload, when no
 * loader that could have made a mapping is left. */
static void free_objects(state *s) {
    for (size_t i = 0; i < MAX_OBJECTS; i++) {
        object *o = &s->objects[i];
        if (o->kind == OBJ_MEMORY || o->kind == OBJ_RETIRED) free((void *)(uintptr_t)o->handle);
        o->kind = OBJ_NONE;
    }
}

/* Clears the log, knobs, faults and objects. Device memory is given back (release_memory):
 * live host mappings stay registered, and the storage they cover is kept until they are
 * unregistered, so a holder of a mapping never reads freed memory. */
EXPORT void standin_reset(void) {
    S();
    pthread_mutex_lock(&st->lock);
    for (size_t i = 0; i < MAX_OBJECTS; i++) {
        object *o = &st->objects[i];
        if (o->kind == OBJ_MEMORY) release_memory(st, o);
        else if (o->kind != OBJ_MAPPING && o->kind != OBJ_RETIRED) o->kind = OBJ_NONE;
    }
    st->log_len = 0;
    st->log_dropped = 0;
    st->ncounters = 0;
    st->nfaults = 0;
    st->streams_created = 0;
    st->poisoned = 0;
    st->acl_initialized = 0;
    st->after_force_reset = 0;
    memset(st->set_count, 0, sizeof st->set_count);
    set_defaults(st);
    pthread_mutex_unlock(&st->lock);
}

/* Copies up to `cap` entries into `out`, removes them from the log and returns how many. */
EXPORT size_t standin_take_log(standin_call *out, size_t cap) {
    S();
    pthread_mutex_lock(&st->lock);
    size_t n = st->log_len < cap ? st->log_len : cap;
    memcpy(out, st->log, n * sizeof *out);
    memmove(st->log, st->log + n, (st->log_len - n) * sizeof *out);
    st->log_len -= n;
    pthread_mutex_unlock(&st->lock);
    return n;
}

EXPORT uint64_t standin_log_dropped(void) { return S()->log_dropped; }

/* Makes the nth call (1-based, counted since the last reset; 0 = every call) of `func` return
 * `code` without doing anything; with `poison`, that call also poisons the device: every later
 * call returns 507899 until aclrtResetDeviceForce. Returns -1 when the table is full. */
EXPORT int standin_set_fault(const char *func, uint64_t nth, int32_t code, int poison) {
    S();
    pthread_mutex_lock(&st->lock);
    int ret = -1;
    if (func != NULL && st->nfaults < MAX_FAULTS) {
        fault *f = &st->faults[st->nfaults++];
        snprintf(f->func, NAME_LEN, "%s", func);
        f->nth = nth;
        f->code = code;
        f->poison = poison != 0;
        ret = 0;
    }
    pthread_mutex_unlock(&st->lock);
    return ret;
}

/* Sets a knob by name; returns -1 for an unknown name. */
EXPORT int standin_set_value(const char *key, int64_t value) {
    S();
    pthread_mutex_lock(&st->lock);
    int ret = 0;
    if (key == NULL) ret = -1;
    else if (strcmp(key, "sync_timeout_stream") == 0) st->sync_timeout_stream = value;
    else if (strcmp(key, "pending_after_records") == 0) st->pending_after_records = value;
    else if (strcmp(key, "reach_after_syncs") == 0) st->reach_after_syncs = value;
    else if (strcmp(key, "sync_delay_stream") == 0) st->sync_delay_stream = value;
    else if (strcmp(key, "sync_delay_ms") == 0) st->sync_delay_ms = value;
    else if (strcmp(key, "reset_probe_failures") == 0) st->reset_probe_failures = value;
    else if (strcmp(key, "force_reset_delay_ms") == 0) st->force_reset_delay_ms = value;
    else if (strcmp(key, "drain_result") == 0) st->drain_result = value;
    else if (strcmp(key, "cube_core_limit") == 0) st->cube_core_limit = value;
    else if (strcmp(key, "vector_core_limit") == 0) st->vector_core_limit = value;
    else if (strcmp(key, "aicpu_occupy_mask") == 0) st->aicpu_occupy_mask = value;
    else if (strcmp(key, "aicore_valid_mask") == 0) st->aicore_valid_mask = value;
    else if (strcmp(key, "device_count") == 0) st->device_count = value;
    else if (strcmp(key, "version_major") == 0) st->version[0] = value;
    else if (strcmp(key, "version_minor") == 0) st->version[1] = value;
    else if (strcmp(key, "version_patch") == 0) st->version[2] = value;
    else if (strcmp(key, "poisoned") == 0) st->poisoned = value != 0;
    else if (strcmp(key, "soc_name") == 0) st->soc_name = value;
    else if (strcmp(key, "register_reply") == 0) st->register_reply = value;
    else ret = -1;
    pthread_mutex_unlock(&st->lock);
    return ret;
}

/* 1 while ACL is initialised (an aclInit that returned 0 and no aclFinalize since), else 0. */
EXPORT int standin_acl_initialized(void) {
    S();
    pthread_mutex_lock(&st->lock);
    int initialized = st->acl_initialized;
    pthread_mutex_unlock(&st->lock);
    return initialized;
}

/* Live device allocations and host mappings (for leak checks). */
EXPORT size_t standin_live(int kind) {
    S();
    pthread_mutex_lock(&st->lock);
    size_t n = 0;
    for (size_t i = 0; i < MAX_OBJECTS; i++) n += st->objects[i].kind == (enum object_kind)kind;
    pthread_mutex_unlock(&st->lock);
    return n;
}

/* ---- types of the header, written out again --------------------------------------------- */

typedef struct { uint32_t magic; uint32_t version; const void *data; uint64_t length; } rtDevBinary_t;
typedef struct { uint32_t addrOffset; uint32_t dataOffset; } rtHostInputInfo_t;
typedef struct {
    void *args; rtHostInputInfo_t *hostInputInfoPtr; uint32_t argsSize; uint32_t tilingAddrOffset;
    uint32_t tilingDataOffset; uint16_t hostInputInfoNum; uint8_t hasTiling;
    uint8_t isNoNeedH2DCopy; uint8_t reserved[4];
} rtArgsEx_t;
typedef struct {
    uint8_t qos; uint8_t partId; uint8_t schemMode; bool d2dCrossFlag; uint32_t blockDimOffset;
    uint8_t dumpflag; uint8_t neverTimeout; uint8_t rev[2]; uint32_t localMemorySize;
} rtTaskCfgInfo_t;
typedef struct {
    void *args; rtHostInputInfo_t *hostInputInfoPtr; rtHostInputInfo_t *kernelOffsetInfoPtr;
    uint32_t argsSize; uint16_t hostInputInfoNum; uint16_t kernelOffsetInfoNum;
    uint32_t soNameAddrOffset; uint32_t kernelNameAddrOffset; bool isNoNeedH2DCopy;
    uint16_t timeout; uint8_t reserved;
} rtAicpuArgsEx_t;
typedef struct { rtAicpuArgsEx_t baseArgs; size_t cpuParamHeadOffset; uint32_t rsv[4]; } rtCpuKernelArgs_t;
typedef union { uint8_t schemMode; uint32_t localMemorySize; uint32_t rsv[4]; } rtLaunchKernelAttrVal_t;
typedef struct { int id; rtLaunchKernelAttrVal_t value; } rtLaunchKernelAttr_t;
typedef struct { rtLaunchKernelAttr_t *attrs; size_t numAttrs; } rtKernelLaunchCfg_t;
typedef union { uint32_t isLazyLoad; uint32_t magic; int32_t cpuKernelMode; uint32_t rsv[4]; } rtLoadBinaryOptionValue_t;
typedef struct { int optionId; rtLoadBinaryOptionValue_t value; } rtLoadBinaryOption_t;
typedef struct { rtLoadBinaryOption_t *options; size_t numOpt; } rtLoadBinaryConfig_t;
struct AddrMapInPara { unsigned int addr_type; unsigned int devid; };
struct AddrMapOutPara { unsigned long long ptr; unsigned long long len; };
typedef struct { char internal[4108]; } HcclRootInfo;

/* ---- libascendcl.so --------------------------------------------------------------------- */

EXPORT int aclInit(const char *configPath) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    snprintf(c.entry.text, TEXT_LEN, "%s", configPath ? configPath : "");
    if (st->acl_initialized) return fail(&c, E_REPEAT_INIT, "ACL is already initialized");
    st->acl_initialized = 1;
    return finish(&c, OK);
}

EXPORT int aclFinalize(void) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    if (!st->acl_initialized) return fail(&c, E_REPEAT_FINALIZE, "ACL is not initialized");
    st->acl_initialized = 0;
    return finish(&c, OK);
}

EXPORT int aclrtSetDevice(int32_t deviceId) {
    call c = begin(__func__);
    c.entry.device = deviceId;
    if (c.injected) return finish(&c, c.injected);
    return bind(&c, deviceId);
}

EXPORT int aclrtResetDevice(int32_t deviceId) {
    call c = begin(__func__);
    c.entry.device = deviceId;
    if (c.injected) return finish(&c, c.injected);
    return reset(&c, deviceId, 0);
}

EXPORT int aclrtResetDeviceForce(int32_t deviceId) {
    call c = begin(__func__);
    c.entry.device = deviceId;
    int64_t delay = st->force_reset_delay_ms;
    int32_t ret = c.injected ? finish(&c, c.injected) : reset(&c, deviceId, 1);
    /* A force reset takes a while on a device; other threads' calls go on meanwhile. */
    sleep_ms(delay);
    return ret;
}

EXPORT int aclrtGetDevice(int32_t *deviceId) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    int bound = bound_device_now();
    if (deviceId == NULL || bound < 0) return fail(&c, E_PARAM, "no device bound");
    *deviceId = bound;
    c.entry.device = bound;
    return finish(&c, OK);
}

EXPORT int aclrtGetDeviceCount(uint32_t *count) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    if (count == NULL) return fail(&c, E_PARAM, "null out-pointer");
    *count = (uint32_t)st->device_count;
    c.entry.value = st->device_count;
    return finish(&c, OK);
}

EXPORT const char *aclrtGetSocName(void) {
    call c = begin(__func__);
    int64_t i = st->soc_name;
    c.entry.value = i;
    finish(&c, OK);
    return i >= 0 && i < (int64_t)(sizeof SOC_NAMES / sizeof SOC_NAMES[0]) ? SOC_NAMES[i] : NULL;
}

EXPORT int aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    if (!majorVersion || !minorVersion || !patchVersion) return fail(&c, E_PARAM, "null out-pointer");
    *majorVersion = (int32_t)st->version[0];
    *minorVersion = (int32_t)st->version[1];
    *patchVersion = (int32_t)st->version[2];
    return finish(&c, OK);
}

EXPORT int aclrtSetOpExecuteTimeOutV2(uint64_t timeout, uint64_t *actualTimeout) {
    call c = begin(__func__);
    c.entry.timeout = (int64_t)timeout;
    if (c.injected) return finish(&c, c.injected);
    if (actualTimeout != NULL) *actualTimeout = timeout;
    return finish(&c, OK);
}

EXPORT int aclrtGetStreamResLimit(void *stream, int type, uint32_t *value) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stream;
    c.entry.value = type;
    if (c.injected) return finish(&c, c.injected);
    if (value == NULL) return fail(&c, E_PARAM, "null out-pointer");
    if (stream != NULL && find(OBJ_STREAM, c.entry.stream) == NULL)
        return fail(&c, E_PARAM, "not a live stream");
    if (type == 0) *value = (uint32_t)st->cube_core_limit;
    else if (type == 1) *value = (uint32_t)st->vector_core_limit;
    else return fail(&c, E_PARAM, "unknown resource type");
    return finish(&c, OK);
}

EXPORT int aclrtCreateStream(void **stream) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    return create_stream(&c, stream);
}

EXPORT int aclrtDestroyStream(void *stream) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stream;
    if (c.injected) return finish(&c, c.injected);
    return destroy_object(&c, OBJ_STREAM, stream);
}

EXPORT int aclrtSynchronizeStream(void *stream) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stream;
    if (c.injected) return finish(&c, c.injected);
    return sync_stream(&c, stream, -1);
}

EXPORT int aclrtSynchronizeStreamWithTimeout(void *stream, int32_t timeout) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stream;
    c.entry.timeout = timeout;
    if (c.injected) return finish(&c, c.injected);
    return sync_stream(&c, stream, timeout);
}

EXPORT int aclrtSetStreamFailureMode(void *stream, uint64_t mode) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stream;
    c.entry.value = (int64_t)mode;
    if (c.injected) return finish(&c, c.injected);
    if (find(OBJ_STREAM, c.entry.stream) == NULL) return fail(&c, E_PARAM, "not a live stream");
    if (mode > 1) return fail(&c, E_PARAM, "unknown failure mode");
    return finish(&c, OK);
}

EXPORT int aclrtSynchronizeDeviceWithTimeout(int32_t timeout) {
    call c = begin(__func__);
    c.entry.timeout = timeout;
    c.entry.device = bound_device_now();
    if (c.injected) return finish(&c, c.injected);
    if (st->drain_result != OK) return fail(&c, (int32_t)st->drain_result, "drain result knob");
    return finish(&c, OK);
}

EXPORT int aclrtMalloc(void **devPtr, size_t size, int policy) {
    call c = begin(__func__);
    c.entry.size = (int64_t)size;
    if (c.injected) return finish(&c, c.injected);
    (void)policy;
    return alloc_memory(&c, devPtr, size);
}

EXPORT int aclrtFree(void *devPtr) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    return free_memory(&c, devPtr);
}

EXPORT int aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind) {
    call c = begin(__func__);
    c.entry.size = (int64_t)count;
    if (c.injected) return finish(&c, c.injected);
    return copy_memory(&c, dst, destMax, src, count, kind);
}

EXPORT int aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count) {
    call c = begin(__func__);
    c.entry.size = (int64_t)count;
    c.entry.value = value;
    if (c.injected) return finish(&c, c.injected);
    if (count > maxCount) return fail(&c, E_PARAM, "count exceeds maxCount");
    if (find_range((uint64_t)(uintptr_t)devPtr, count) == NULL)
        return fail(&c, E_PARAM, "range outside every device allocation");
    memset(devPtr, value, count);
    return finish(&c, OK);
}

EXPORT const char *aclGetRecentErrMsg(void) {
    S();
    pthread_mutex_lock(&st->lock);
    const char *msg = st->recent_key_created ? pthread_getspecific(st->recent_key) : NULL;
    pthread_mutex_unlock(&st->lock);
    return msg;
}

EXPORT int aclrtCreateEvent(void **event) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    if (event == NULL) return fail(&c, E_PARAM, "null out-pointer");
    if (bound_device_now() < 0) return no_context(&c);
    object *o = new_object(OBJ_EVENT);
    if (o == NULL) return fail(&c, E_PARAM, "too many objects");
    o->context = bound_device_now();
    *event = (void *)(uintptr_t)o->handle;
    c.entry.value = (int64_t)o->handle;
    return finish(&c, OK);
}

EXPORT int aclrtDestroyEvent(void *event) {
    call c = begin(__func__);
    c.entry.value = (int64_t)(uintptr_t)event;
    if (c.injected) return finish(&c, c.injected);
    return destroy_object(&c, OBJ_EVENT, event);
}

EXPORT int aclrtRecordEvent(void *event, void *stream) {
    call c = begin(__func__);
    c.entry.value = (int64_t)(uintptr_t)event;
    c.entry.stream = (uint64_t)(uintptr_t)stream;
    if (c.injected) return finish(&c, c.injected);
    object *e = find(OBJ_EVENT, (uint64_t)(uintptr_t)event);
    if (e == NULL || find(OBJ_STREAM, c.entry.stream) == NULL)
        return fail(&c, E_PARAM, "not a live event or stream");
    /* Nothing runs, so a recorded event is complete at once, unless the device is made to
     * stop: then the records past the knob's count are never reached. */
    if (st->pending_after_records < 0) {
        e->recorded = 1;
    } else if (st->pending_after_records > 0) {
        e->recorded = 1;
        st->pending_after_records--;
    } else {
        e->recorded = RECORDED_NOT_REACHED;
    }
    e->owner = c.entry.stream;
    return finish(&c, OK);
}

EXPORT int aclrtQueryEventStatus(void *event, int *status) {
    call c = begin(__func__);
    c.entry.value = (int64_t)(uintptr_t)event;
    if (c.injected) return finish(&c, c.injected);
    object *e = find(OBJ_EVENT, (uint64_t)(uintptr_t)event);
    if (e == NULL || status == NULL) return fail(&c, E_PARAM, "not a live event");
    *status = e->recorded == 1 ? 1 : 0;
    return finish(&c, OK);
}

EXPORT int aclrtSynchronizeEventWithTimeout(void *event, int32_t timeout) {
    call c = begin(__func__);
    c.entry.value = (int64_t)(uintptr_t)event;
    c.entry.timeout = timeout;
    if (c.injected) return finish(&c, c.injected);
    object *e = find(OBJ_EVENT, (uint64_t)(uintptr_t)event);
    if (e == NULL) return fail(&c, E_PARAM, "not a live event");
    if (st->reach_after_syncs == 0) {
        /* The stopped device goes on: every event it had not reached is reached now. */
        st->pending_after_records = -1;
        for (size_t i = 0; i < MAX_OBJECTS; i++)
            if (st->objects[i].kind == OBJ_EVENT && st->objects[i].recorded == RECORDED_NOT_REACHED)
                st->objects[i].recorded = 1;
    }
    if (st->reach_after_syncs >= 0) st->reach_after_syncs--;
    object *s = find(OBJ_STREAM, e->owner);
    c.entry.stream = e->owner;
    if (s != NULL && e->recorded == 1 && !finish_within((int64_t)s->size, timeout))
        return fail(&c, E_EVENT_SYNC_TIMEOUT, "the device did not reach the event within the timeout");
    if (s != NULL && st->sync_timeout_stream != 0 && (int64_t)s->size == st->sync_timeout_stream)
        return fail(&c, E_EVENT_SYNC_TIMEOUT,
                    "the event's stream did not finish within the timeout");
    if (e->recorded == RECORDED_NOT_REACHED)
        return fail(&c, E_EVENT_SYNC_TIMEOUT, "the device did not reach the event within the timeout");
    return finish(&c, OK);
}

EXPORT int aclrtStreamWaitEvent(void *stream, void *event) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stream;
    c.entry.value = (int64_t)(uintptr_t)event;
    if (c.injected) return finish(&c, c.injected);
    if (find(OBJ_EVENT, (uint64_t)(uintptr_t)event) == NULL ||
        find(OBJ_STREAM, c.entry.stream) == NULL)
        return fail(&c, E_PARAM, "not a live event or stream");
    return finish(&c, OK);
}

/* ---- libruntime.so ---------------------------------------------------------------------- */

EXPORT int32_t rtSetDevice(int32_t devId) {
    call c = begin(__func__);
    c.entry.device = devId;
    if (c.injected) return finish(&c, c.injected);
    return bind(&c, devId);
}

EXPORT int32_t rtDeviceReset(int32_t devId) {
    call c = begin(__func__);
    c.entry.device = devId;
    if (c.injected) return finish(&c, c.injected);
    return reset(&c, devId, 0);
}

EXPORT int32_t rtStreamCreate(void **stm, int32_t priority) {
    call c = begin(__func__);
    c.entry.value = priority;
    if (c.injected) return finish(&c, c.injected);
    return create_stream(&c, stm);
}

EXPORT int32_t rtStreamDestroy(void *stm) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stm;
    if (c.injected) return finish(&c, c.injected);
    return destroy_object(&c, OBJ_STREAM, stm);
}

EXPORT int32_t rtMalloc(void **devPtr, uint64_t size, uint32_t type, uint16_t moduleId) {
    call c = begin(__func__);
    c.entry.size = (int64_t)size;
    if (c.injected) return finish(&c, c.injected);
    (void)type;
    (void)moduleId;
    return alloc_memory(&c, devPtr, size);
}

EXPORT int32_t rtFree(void *devPtr) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    return free_memory(&c, devPtr);
}

EXPORT int32_t rtMemcpy(void *dst, uint64_t destMax, const void *src, uint64_t cnt, int kind) {
    call c = begin(__func__);
    c.entry.size = (int64_t)cnt;
    if (c.injected) return finish(&c, c.injected);
    return copy_memory(&c, dst, destMax, src, cnt, kind);
}

EXPORT int32_t rtRegisterAllKernel(const rtDevBinary_t *bin, void **hdl) {
    call c = begin(__func__);
    if (bin != NULL) c.entry.size = (int64_t)bin->length;
    if (c.injected) return finish(&c, c.injected);
    if (bin == NULL || hdl == NULL || bin->data == NULL || bin->length == 0)
        return fail(&c, E_PARAM, "null binary or out-pointer");
    if (bin->magic != 0x43554245U) return fail(&c, E_PARAM, "not an ELF device binary");
    object *o = new_object(OBJ_KERNEL_BIN);
    if (o == NULL) return fail(&c, E_PARAM, "too many objects");
    *hdl = (void *)(uintptr_t)o->handle;
    c.entry.value = (int64_t)o->handle;
    return finish(&c, OK);
}

EXPORT int32_t rtDevBinaryUnRegister(void *hdl) {
    call c = begin(__func__);
    c.entry.value = (int64_t)(uintptr_t)hdl;
    if (c.injected) return finish(&c, c.injected);
    return destroy_object(&c, OBJ_KERNEL_BIN, hdl);
}

EXPORT int32_t rtKernelLaunchWithHandleV2(void *hdl, uint64_t tilingKey, uint32_t blockDim,
                                          rtArgsEx_t *argsInfo, void *smDesc, void *stm,
                                          const rtTaskCfgInfo_t *cfgInfo) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stm;
    c.entry.block_dim = blockDim;
    if (argsInfo != NULL) c.entry.size = argsInfo->argsSize;
    if (cfgInfo != NULL) c.entry.value = cfgInfo->schemMode;
    if (c.injected) return finish(&c, c.injected);
    (void)tilingKey;
    (void)smDesc;
    if (find(OBJ_KERNEL_BIN, (uint64_t)(uintptr_t)hdl) == NULL)
        return fail(&c, E_PARAM, "not a registered kernel binary");
    if (find(OBJ_STREAM, c.entry.stream) == NULL) return fail(&c, E_PARAM, "not a live stream");
    if (argsInfo == NULL || argsInfo->args == NULL) return fail(&c, E_PARAM, "no arguments");
    return finish(&c, OK);
}

EXPORT int32_t rtGetC2cCtrlAddr(uint64_t *addr, uint32_t *len) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    if (addr == NULL || len == NULL) return fail(&c, E_PARAM, "null out-pointer");
    *addr = 0x10000000ULL;
    *len = 0x1000;
    return finish(&c, OK);
}

EXPORT int32_t rtAicpuKernelLaunchExWithArgs(uint32_t kernelType, const char *opName,
                                             uint32_t blockDim, const rtAicpuArgsEx_t *argsInfo,
                                             void *smDesc, void *stm, uint32_t flags) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stm;
    c.entry.block_dim = blockDim;
    c.entry.value = kernelType;
    snprintf(c.entry.text, TEXT_LEN, "%s", opName ? opName : "");
    if (argsInfo != NULL) c.entry.size = argsInfo->argsSize;
    if (c.injected) return finish(&c, c.injected);
    (void)smDesc;
    (void)flags;
    if (find(OBJ_STREAM, c.entry.stream) == NULL) return fail(&c, E_PARAM, "not a live stream");
    if (opName == NULL || argsInfo == NULL) return fail(&c, E_PARAM, "no op name or arguments");
    return finish(&c, OK);
}

/* Collects the "opType" values of a JSON op description (a flat scan is enough here). */
static int read_op_types(const char *path, object *bin) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return -1;
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = buf;
    while ((p = strstr(p, "\"opType\"")) != NULL && bin->nops < MAX_OPS) {
        p = strchr(p + 8, '"');
        if (p == NULL) break;
        const char *end = strchr(p + 1, '"');
        if (end == NULL) break;
        size_t len = (size_t)(end - p - 1);
        if (len >= sizeof bin->ops[0]) len = sizeof bin->ops[0] - 1;
        memcpy(bin->ops[bin->nops], p + 1, len);
        bin->ops[bin->nops][len] = 0;
        bin->nops++;
        p = end + 1;
    }
    return 0;
}

EXPORT int32_t rtsBinaryLoadFromFile(const char *binPath, const rtLoadBinaryConfig_t *optionalCfg,
                                     void **handle) {
    call c = begin(__func__);
    snprintf(c.entry.text, TEXT_LEN, "%s", binPath ? binPath : "");
    if (optionalCfg != NULL && optionalCfg->numOpt > 0 && optionalCfg->options != NULL)
        c.entry.value = optionalCfg->options[0].value.cpuKernelMode;
    if (c.injected) return finish(&c, c.injected);
    if (binPath == NULL || handle == NULL) return fail(&c, E_PARAM, "null path or out-pointer");
    object *o = new_object(OBJ_CPU_BIN);
    if (o == NULL) return fail(&c, E_PARAM, "too many objects");
    o->context = bound_device_now();
    if (read_op_types(binPath, o) != 0) {
        o->kind = OBJ_NONE;
        return fail(&c, E_PARAM, "cannot read the op description");
    }
    *handle = (void *)(uintptr_t)o->handle;
    c.entry.size = o->nops;
    return finish(&c, OK);
}

EXPORT int32_t rtsFuncGetByName(void *binHandle, const char *kernelName, void **funcHandle) {
    call c = begin(__func__);
    snprintf(c.entry.text, TEXT_LEN, "%s", kernelName ? kernelName : "");
    if (c.injected) return finish(&c, c.injected);
    object *bin = find(OBJ_CPU_BIN, (uint64_t)(uintptr_t)binHandle);
    if (bin == NULL || kernelName == NULL || funcHandle == NULL)
        return fail(&c, E_PARAM, "not a loaded binary");
    for (int i = 0; i < bin->nops; i++) {
        if (strcmp(bin->ops[i], kernelName) == 0) {
            object *f = new_object(OBJ_FUNC);
            if (f == NULL) return fail(&c, E_PARAM, "too many objects");
            f->owner = bin->handle;
            snprintf(f->ops[0], sizeof f->ops[0], "%s", kernelName);
            *funcHandle = (void *)(uintptr_t)f->handle;
            c.entry.value = (int64_t)f->handle;
            return finish(&c, OK);
        }
    }
    return fail(&c, E_PARAM, "the binary has no op of that name");
}

/* The AICPU program's register entry, as far as a library that runs no device code can play
 * it: the launch's argument block (the simulator crate's `RegisterArgs`: abi_version, op, slot,
 * reserved, then object address, object length and reply address as qwords at 16, 24, 32) is
 * checked against the live allocations, and the reply (status, message length, entry, config)
 * is written into the reply block. Knob `register_reply`: 0 answers success with the object's
 * address as both functions (an unload answers success), a positive value answers that failure
 * status, a negative one writes nothing (a program that never ran). */
#define REGISTER_ARGS_LEN 296
#define REGISTER_REPLY_LEN 256
static int answer_register(call *c, const rtCpuKernelArgs_t *a) {
    if (a->baseArgs.argsSize != REGISTER_ARGS_LEN || a->baseArgs.args == NULL)
        return fail(c, E_PARAM, "register entry: the argument block is not 296 bytes");
    const uint8_t *args = (const uint8_t *)a->baseArgs.args;
    uint32_t op;
    uint64_t object, object_len, reply;
    memcpy(&op, args + 4, 4);
    memcpy(&object, args + 16, 8);
    memcpy(&object_len, args + 24, 8);
    memcpy(&reply, args + 32, 8);
    if (find_range(reply, REGISTER_REPLY_LEN) == NULL)
        return fail(c, E_PARAM, "register entry: the reply block is outside every allocation");
    if (op == 1 && (object_len == 0 || find_range(object, object_len) == NULL))
        return fail(c, E_PARAM, "register entry: the object is outside every allocation");
    if (st->register_reply < 0) return finish(c, OK);
    uint8_t *r = (uint8_t *)(uintptr_t)reply;
    memset(r, 0, REGISTER_REPLY_LEN);
    uint32_t status = (uint32_t)st->register_reply;
    memcpy(r, &status, 4);
    if (status != 0) {
        static const char text[] = "refused by the stand-in";
        uint32_t len = sizeof text - 1;
        memcpy(r + 4, &len, 4);
        memcpy(r + 24, text, len);
    } else if (op == 1) {
        memcpy(r + 8, &object, 8);
        memcpy(r + 16, &object, 8);
    }
    return finish(c, OK);
}

EXPORT int32_t rtsLaunchCpuKernel(void *funcHandle, uint32_t blockDim, void *stm,
                                  const rtKernelLaunchCfg_t *cfg, rtCpuKernelArgs_t *argsInfo) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stm;
    c.entry.block_dim = blockDim;
    if (argsInfo != NULL) c.entry.size = argsInfo->baseArgs.argsSize;
    object *f = find(OBJ_FUNC, (uint64_t)(uintptr_t)funcHandle);
    if (f != NULL) snprintf(c.entry.text, TEXT_LEN, "%s", f->ops[0]);
    if (c.injected) return finish(&c, c.injected);
    (void)cfg;
    if (f == NULL || find(OBJ_CPU_BIN, f->owner) == NULL)
        return fail(&c, E_PARAM, "not a function of a loaded binary");
    if (find(OBJ_STREAM, c.entry.stream) == NULL) return fail(&c, E_PARAM, "not a live stream");
    if (argsInfo == NULL) return fail(&c, E_PARAM, "no arguments");
    if (strncmp(f->ops[0], "simpler_aicpu_register_callable", 31) == 0)
        return answer_register(&c, argsInfo);
    return finish(&c, OK);
}

EXPORT int32_t rtsBinaryUnload(void *binHandle) {
    call c = begin(__func__);
    c.entry.value = (int64_t)(uintptr_t)binHandle;
    if (c.injected) return finish(&c, c.injected);
    return destroy_object(&c, OBJ_CPU_BIN, binHandle);
}

/* ---- libascend_hal.so ------------------------------------------------------------------- */

EXPORT int halHostRegister(void *devPtr, size_t size, unsigned int flag, int devid,
                           void **hostPtr) {
    call c = begin(__func__);
    c.entry.device = devid;
    c.entry.size = (int64_t)size;
    c.entry.value = flag;
    if (c.injected) return finish(&c, c.injected);
    if (hostPtr == NULL || find_range((uint64_t)(uintptr_t)devPtr, size) == NULL)
        return fail(&c, E_PARAM, "range outside every device allocation");
    object *o = new_object(OBJ_MAPPING);
    if (o == NULL) return fail(&c, E_PARAM, "too many objects");
    o->handle = (uint64_t)(uintptr_t)devPtr;
    o->size = size;
    /* Device memory is host memory here, so the mapping is the identity. */
    *hostPtr = devPtr;
    return finish(&c, OK);
}

EXPORT int halHostUnregister(void *devPtr, int devid) {
    call c = begin(__func__);
    c.entry.device = devid;
    if (c.injected) return finish(&c, c.injected);
    object *o = find(OBJ_MAPPING, (uint64_t)(uintptr_t)devPtr);
    if (o == NULL) return fail(&c, E_PARAM, "not a live handle");
    o->kind = OBJ_NONE;
    free_unmapped_retired(st);
    return finish(&c, OK);
}

EXPORT int halGetDeviceInfo(uint32_t devId, int32_t moduleType, int32_t infoType, int64_t *value) {
    call c = begin(__func__);
    c.entry.device = (int64_t)devId;
    c.entry.value = moduleType * 100 + infoType;
    if (c.injected) return finish(&c, c.injected);
    if (value == NULL) return fail(&c, E_PARAM, "null out-pointer");
    if (moduleType == 1 && infoType == 8) *value = st->aicpu_occupy_mask;
    else if (infoType == 3) *value = moduleType == 1 ? 6 : st->cube_core_limit;
    else return fail(&c, E_PARAM, "unsupported module/info pair");
    return finish(&c, OK);
}

EXPORT int halGetDeviceInfoByBuff(uint32_t devId, int32_t moduleType, int32_t infoType, void *buf,
                                  int32_t *size) {
    call c = begin(__func__);
    c.entry.device = (int64_t)devId;
    c.entry.value = moduleType * 100 + infoType;
    if (c.injected) return finish(&c, c.injected);
    if (buf == NULL || size == NULL || *size < 8) return fail(&c, E_PARAM, "buffer too small");
    if (moduleType != 4 || infoType != 8) return fail(&c, E_PARAM, "unsupported module/info pair");
    memcpy(buf, &st->aicore_valid_mask, 8);
    *size = 8;
    return finish(&c, OK);
}

EXPORT int halMemCtl(int type, void *paramValue, size_t paramValueSize, void *outValue,
                     size_t *outSizeRet) {
    call c = begin(__func__);
    c.entry.value = type;
    if (c.injected) return finish(&c, c.injected);
    if (type != 0 || paramValue == NULL || paramValueSize < sizeof(struct AddrMapInPara) ||
        outValue == NULL)
        return fail(&c, E_PARAM, "only CTRL_TYPE_ADDR_MAP with AddrMapInPara is supported");
    struct AddrMapInPara *in = paramValue;
    struct AddrMapOutPara *out = outValue;
    c.entry.device = in->devid;
    /* A fake register window per address type. */
    out->ptr = 0x20000000ULL + (unsigned long long)in->addr_type * 0x100000ULL;
    out->len = 0x100000ULL;
    if (outSizeRet != NULL) *outSizeRet = sizeof *out;
    return finish(&c, OK);
}

/* ---- libunified_dlog.so ----------------------------------------------------------------- */

EXPORT int dlog_setlevel(int moduleId, int level, int enableEvent) {
    call c = begin(__func__);
    c.entry.value = level;
    (void)moduleId;
    (void)enableEvent;
    if (c.injected) return finish(&c, c.injected);
    return finish(&c, OK);
}

/* ---- libhccl.so ------------------------------------------------------------------------- */

EXPORT int32_t HcclGetRootInfo(HcclRootInfo *rootInfo) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    if (rootInfo == NULL) return fail(&c, E_PARAM, "null out-pointer");
    memset(rootInfo, 0, sizeof *rootInfo);
    snprintf(rootInfo->internal, sizeof rootInfo->internal, "stand-in root");
    return finish(&c, OK);
}

EXPORT int32_t HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                    void **comm) {
    call c = begin(__func__);
    c.entry.value = rank;
    c.entry.size = nRanks;
    if (c.injected) return finish(&c, c.injected);
    if (rootInfo == NULL || comm == NULL || rank >= nRanks) return fail(&c, E_PARAM, "bad rank");
    object *o = new_object(OBJ_COMM);
    if (o == NULL) return fail(&c, E_PARAM, "too many objects");
    *comm = (void *)(uintptr_t)o->handle;
    return finish(&c, OK);
}

EXPORT int32_t HcclBarrier(void *comm, void *stream) {
    call c = begin(__func__);
    c.entry.stream = (uint64_t)(uintptr_t)stream;
    if (c.injected) return finish(&c, c.injected);
    if (find(OBJ_COMM, (uint64_t)(uintptr_t)comm) == NULL) return fail(&c, E_PARAM, "not a comm");
    return finish(&c, OK);
}

EXPORT int32_t HcclCommDestroy(void *comm) {
    call c = begin(__func__);
    if (c.injected) return finish(&c, c.injected);
    return destroy_object(&c, OBJ_COMM, comm);
}
