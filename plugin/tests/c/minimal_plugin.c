/*
 * A minimal unihal plugin written in C against unihal_plugin.h alone: memory, host memory,
 * streams and events on host memory, two devices named "cminimal". Streams run their work at
 * enqueue (an in-order queue that is always drained), so events complete when recorded and
 * waits are already satisfied. Everything else (kernels, library ops, collectives, host
 * callbacks, peer copies) is left NULL and the manifest declares those cases unsupported.
 *
 * Test variants (the tests compile this file with -D...):
 *   UH_TEST_TABLE_MAJOR=n   the table claims ABI major n (the host must refuse it and call
 *                           nothing else: every other entry aborts the process in this mode)
 *   UH_TEST_REFUSE_HOST     the entry refuses every host with UH_ERR_ABI_MISMATCH
 *   UH_TEST_NO_STREAMS      the table leaves required stream entries NULL
 *   UH_TEST_NAME="..."      the backend name reported
 *   UH_TEST_UNKNOWN_STATUS=n mem_alloc fails with status n, which the ABI does not define (the
 *                           host must name the entry)
 */
#define _POSIX_C_SOURCE 200809L
#include "unihal_plugin.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(UH_TEST_NO_STREAMS) || defined(UH_TEST_REFUSE_HOST)
/* These variants leave entries out of the table or never return it. */
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wunused-const-variable"
#endif

#ifndef UH_TEST_NAME
#define UH_TEST_NAME "cminimal"
#endif
#ifdef UH_TEST_TABLE_MAJOR
#define ONLY_ENTRY() abort()
#else
#define ONLY_ENTRY() ((void)0)
#endif

#define N_DEVICES 2
#define MEMORY_BYTES (1ull << 30)
#define ALIGN 256

struct uh_device { uint32_t ordinal; };
struct uh_mem { uint32_t device; uint64_t len; uint8_t *ptr; };
struct uh_host_mem { uint64_t len; uint8_t *ptr; };
struct uh_stream { uint32_t device; };
struct uh_event { uint32_t device; uint32_t flags; _Atomic int64_t stamp_ns; };

static _Atomic uint64_t used[N_DEVICES];
static struct uh_device devices[N_DEVICES] = {{0}, {1}};

static uh_status fail(uh_error *err, int32_t code, int32_t invalid, const char *arg, const char *msg) {
  if (err) {
    err->code = code;
    err->invalid = invalid;
    snprintf(err->arg, sizeof err->arg, "%s", arg ? arg : "");
    snprintf(err->message, sizeof err->message, "%s", msg ? msg : "");
  }
  return code;
}

static uh_status range(uh_error *err, const char *arg, uint64_t off, uint64_t len, uint64_t size) {
  if (off > size || len > size - off) {
    if (err) {
      err->num[0] = off;
      err->num[1] = len;
      err->num[2] = size;
    }
    return fail(err, UH_ERR_INVALID_ARGUMENT, UH_INVALID_OUT_OF_RANGE, arg, "");
  }
  return UH_OK;
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static const char manifest[] =
    "unsupported kernels.* the minimal C plugin loads no modules\n"
    "unsupported ops.* the minimal C plugin has no library ops\n"
    "unsupported ccl.* the minimal C plugin has no collective engine\n";

static const uh_library_info libraries[] = {
    {sizeof(uh_library_info), 0, "runtime", "C standard library", "libc", NULL, NULL},
};

static const uh_plugin_info plugin_info = {
    sizeof(uh_plugin_info), 0, UH_TEST_NAME, "0.1.0-minimal-c", 0, 1,
    1, 0, libraries, manifest,
};

static const uh_plugin_info *info(void) { ONLY_ENTRY(); return &plugin_info; }

static uh_status probe(uint32_t *count, uh_error *err) {
  (void)err;
  ONLY_ENTRY();
  *count = N_DEVICES;
  return UH_OK;
}

static uh_status device_open(uint32_t ordinal, uh_device **out, uh_error *err) {
  ONLY_ENTRY();
  if (ordinal >= N_DEVICES) return fail(err, UH_ERR_INVALID_ARGUMENT, UH_INVALID_OTHER, "ordinal", "no such device");
  *out = &devices[ordinal];
  return UH_OK;
}

static void device_release(uh_device *dev) { (void)dev; }

static const char *names[N_DEVICES] = {"minimal C device 0", "minimal C device 1"};

static uh_status device_props(uh_device *dev, uh_device_props *p, uh_error *err) {
  (void)err;
  ONLY_ENTRY();
  memset(p, 0, sizeof *p);
  p->size = sizeof *p;
  p->name = names[dev->ordinal];
  p->vendor = "host";
  p->memory_bytes = MEMORY_BYTES;
  p->alloc_alignment = ALIGN;
  p->compute_units = 1;
  p->warp_size = 1;
  p->max_grid[0] = p->max_grid[1] = p->max_grid[2] = 1;
  p->max_block[0] = p->max_block[1] = p->max_block[2] = 1;
  p->max_threads_per_block = 1;
  p->flags = UH_CAP_EVENT_TIMING | UH_CAP_WIDE_FILL;
  p->timer_resolution_ns = 1;
  return UH_OK;
}

static uh_status device_memory_info(uh_device *dev, uint64_t *total, uint64_t *free_bytes, uh_error *err) {
  (void)err;
  *total = MEMORY_BYTES;
  *free_bytes = MEMORY_BYTES - atomic_load(&used[dev->ordinal]);
  return UH_OK;
}

static uh_status device_synchronize(uh_device *dev, uh_error *err) {
  (void)dev;
  (void)err;
  return UH_OK; /* streams drain at enqueue */
}

static uh_status mem_alloc(uh_device *dev, uint64_t len, uh_mem **out, uint64_t *addr, uh_error *err) {
#ifdef UH_TEST_UNKNOWN_STATUS
  (void)dev, (void)len, (void)out, (void)addr;
  return fail(err, UH_TEST_UNKNOWN_STATUS, 0, NULL, "a status of a newer ABI");
#endif
  uint64_t before = atomic_fetch_add(&used[dev->ordinal], len);
  if (len > MEMORY_BYTES || before > MEMORY_BYTES - len) {
    atomic_fetch_sub(&used[dev->ordinal], len);
    if (err) {
      err->num[0] = len;
      err->num[1] = MEMORY_BYTES - before;
    }
    return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "");
  }
  uh_mem *m = malloc(sizeof *m);
  uint8_t *p = aligned_alloc(ALIGN, len == 0 ? ALIGN : (len + ALIGN - 1) / ALIGN * ALIGN);
  if (!m || !p) {
    free(m);
    free(p);
    atomic_fetch_sub(&used[dev->ordinal], len);
    return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "malloc failed");
  }
  memset(p, 0, len);
  m->device = dev->ordinal;
  m->len = len;
  m->ptr = p;
  *out = m;
  *addr = (uint64_t)(uintptr_t)p;
  return UH_OK;
}

static void mem_release(uh_mem *m) {
  /* Work runs at enqueue: nothing queued can still use the memory. */
  atomic_fetch_sub(&used[m->device], m->len);
  free(m->ptr);
  free(m);
}

static uh_status host_alloc(uh_device *dev, uint64_t len, uh_host_mem **out, void **ptr, uh_error *err) {
  (void)dev;
  uh_host_mem *h = malloc(sizeof *h);
  uint8_t *p = calloc(1, len == 0 ? 1 : len);
  if (!h || !p) {
    free(h);
    free(p);
    if (err) err->num[0] = len;
    return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "calloc failed");
  }
  h->len = len;
  h->ptr = p;
  *out = h;
  *ptr = p;
  return UH_OK;
}

static void host_release(uh_host_mem *h) {
  free(h->ptr);
  free(h);
}

static uh_status stream_create(uh_device *dev, uh_stream **out, uh_error *err) {
  uh_stream *s = malloc(sizeof *s);
  if (!s) return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "malloc failed");
  s->device = dev->ordinal;
  *out = s;
  return UH_OK;
}

static void stream_release(uh_stream *s) { free(s); }

static uh_status copy_h2d(uh_stream *s, uh_host_mem *src, uint64_t so, uh_mem *dst, uint64_t doff, uint64_t len, uh_error *err) {
  (void)s;
  uh_status r = range(err, "src", so, len, src->len);
  if (r == UH_OK) r = range(err, "dst", doff, len, dst->len);
  if (r == UH_OK && len) memcpy(dst->ptr + doff, src->ptr + so, len);
  return r;
}

static uh_status copy_d2h(uh_stream *s, uh_mem *src, uint64_t so, uh_host_mem *dst, uint64_t doff, uint64_t len, uh_error *err) {
  (void)s;
  uh_status r = range(err, "src", so, len, src->len);
  if (r == UH_OK) r = range(err, "dst", doff, len, dst->len);
  if (r == UH_OK && len) memcpy(dst->ptr + doff, src->ptr + so, len);
  return r;
}

static uh_status copy_d2d(uh_stream *s, uh_mem *src, uint64_t so, uh_mem *dst, uint64_t doff, uint64_t len, uh_error *err) {
  (void)s;
  uh_status r = range(err, "src", so, len, src->len);
  if (r == UH_OK) r = range(err, "dst", doff, len, dst->len);
  if (r == UH_OK && len) memcpy(dst->ptr + doff, src->ptr + so, len);
  return r;
}

static uh_status fill(uh_stream *s, uh_mem *dst, uint64_t off, uint64_t len, uint32_t width, uint32_t value, uh_error *err) {
  (void)s;
  uh_status r = range(err, "dst", off, len, dst->len);
  if (r != UH_OK) return r;
  if ((width != 1 && width != 2 && width != 4) || off % width || len % width)
    return fail(err, UH_ERR_INVALID_ARGUMENT, UH_INVALID_OTHER, "len", "not a multiple of the pattern width");
  for (uint64_t i = 0; i < len; i += width) memcpy(dst->ptr + off + i, &value, width); /* little-endian host */
  return UH_OK;
}

static uh_status stream_synchronize(uh_stream *s, uh_error *err) {
  (void)s;
  (void)err;
  return UH_OK;
}

static uh_status stream_query(uh_stream *s, uint32_t *done, uh_error *err) {
  (void)s;
  (void)err;
  *done = 1;
  return UH_OK;
}

static uh_status stream_async_error(uh_stream *s, uh_error *err) {
  (void)s;
  (void)err;
  return UH_OK;
}

static uh_status event_create(uh_device *dev, uint32_t flags, uh_event **out, uh_error *err) {
  uh_event *e = malloc(sizeof *e);
  if (!e) return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "malloc failed");
  e->device = dev->ordinal;
  e->flags = flags;
  atomic_init(&e->stamp_ns, -1);
  *out = e;
  return UH_OK;
}

static void event_release(uh_event *e) { free(e); }

static uh_status event_record(uh_stream *s, uh_event *e, uh_error *err) {
  (void)s;
  (void)err;
  atomic_store(&e->stamp_ns, now_ns()); /* the work before it has run */
  return UH_OK;
}

static uh_status stream_wait_event(uh_stream *s, uh_event *e, uh_error *err) {
  (void)s;
  (void)e;
  (void)err;
  return UH_OK; /* recorded work has run */
}

static uh_status event_query(uh_event *e, uint32_t *done, uh_error *err) {
  (void)e;
  (void)err;
  *done = 1;
  return UH_OK;
}

static uh_status event_synchronize(uh_event *e, uh_error *err) {
  (void)e;
  (void)err;
  return UH_OK;
}

static uh_status event_elapsed(uh_event *a, uh_event *b, float *ms, uh_error *err) {
  int64_t ta = atomic_load(&a->stamp_ns), tb = atomic_load(&b->stamp_ns);
  if (ta < 0 || tb < 0)
    return fail(err, UH_ERR_INVALID_ARGUMENT, UH_INVALID_OTHER, "event", "an event that was never recorded");
  *ms = (float)((double)(tb - ta) / 1e6);
  return UH_OK;
}

static const uh_plugin_api table = {
    .size = sizeof(uh_plugin_api),
#ifdef UH_TEST_TABLE_MAJOR
    .abi_major = UH_TEST_TABLE_MAJOR,
#else
    .abi_major = UH_ABI_MAJOR,
#endif
    .abi_minor = UH_ABI_MINOR,
    .info = info,
    .probe = probe,
    .device_open = device_open,
    .device_release = device_release,
    .device_props = device_props,
    .device_memory_info = device_memory_info,
    .device_synchronize = device_synchronize,
    .mem_alloc = mem_alloc,
    .mem_release = mem_release,
    .host_alloc = host_alloc,
    .host_release = host_release,
#ifndef UH_TEST_NO_STREAMS
    .stream_create = stream_create,
    .stream_release = stream_release,
    .copy_h2d = copy_h2d,
    .copy_d2h = copy_d2h,
    .copy_d2d = copy_d2d,
    .stream_synchronize = stream_synchronize,
    .stream_query = stream_query,
#endif
    .fill = fill,
    .stream_async_error = stream_async_error,
    .event_create = event_create,
    .event_release = event_release,
    .event_record = event_record,
    .stream_wait_event = stream_wait_event,
    .event_query = event_query,
    .event_synchronize = event_synchronize,
    .event_elapsed = event_elapsed,
};

const uh_plugin_api *unihal_plugin_entry(const uh_host_api *host, uh_error *err) {
#ifdef UH_TEST_REFUSE_HOST
  (void)host;
  return fail(err, UH_ERR_ABI_MISMATCH, 0, NULL, "this plugin speaks unihal plugin ABI 2.0 only"), NULL;
#else
  if (!host || host->abi_major != UH_ABI_MAJOR) {
    fail(err, UH_ERR_ABI_MISMATCH, 0, NULL, "the host speaks another plugin ABI major");
    return NULL;
  }
  if (host->log) host->log(UH_LOG_INFO, "cminimal", "minimal C plugin loaded");
  return &table;
#endif
}
