/*
 * An asynchronous unihal plugin written in C against unihal_plugin.h alone: memory, host memory,
 * streams, events and host callbacks, two devices named "casync". Where minimal_plugin.c runs
 * every operation at enqueue, here each stream is a queue with a thread of its own (pthreads),
 * as a vendor's queue runs beside the host:
 *
 *  - an enqueue (copy, fill, event record, event wait, host callback) appends an operation and
 *    returns; the stream's thread runs the operations in order;
 *  - an event counts its records: a record enqueued is a generation, and the queue thread marks
 *    the generation reached when it runs the record (a later record wins: the event is complete
 *    once the latest generation is reached); a wait enqueued on another stream holds that
 *    stream's thread until the generation recorded at the time of the wait is reached;
 *  - host callbacks run on the stream's thread, in order, exactly once (with UH_OK when they
 *    run, with an error status when the enqueue is refused);
 *  - a callback that waits for its own stream (its stream, an event whose latest record is
 *    behind it on that stream, or its stream's device) would wait forever: those waits return
 *    UH_ERR_INVALID_ARGUMENT instead;
 *  - releases never wait: queued operations hold references to the memory, host memory and
 *    events they use, freed when the last one goes; a released stream's thread runs what is
 *    queued, then frees the stream and exits.
 *
 * Build (docs/PORTING.md):
 *   cc -std=c11 -O2 -Wall -Wextra -shared -fPIC -pthread -I <unihal>/plugin/abi/include \
 *      -o libcasync_plugin.so async_plugin.c
 *
 * Kernels, library ops, collectives and peer copies are left NULL and the manifest declares
 * those cases unsupported.
 */
#define _POSIX_C_SOURCE 200809L
#include "unihal_plugin.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NAME "casync"
#define N_DEVICES 2
#define MEMORY_BYTES (1ull << 30)
#define ALIGN 256

struct uh_device { uint32_t ordinal; };

/* Device memory is host memory here; `refs` counts the handle and every queued use. */
struct uh_mem { uint32_t device; uint64_t len; uint8_t *ptr; _Atomic uint32_t refs; };
struct uh_host_mem { uint64_t len; uint8_t *ptr; _Atomic uint32_t refs; };

struct uh_event {
  uint32_t device;
  uint32_t flags;
  _Atomic uint32_t refs;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t recorded; /* records enqueued: the latest generation */
  uint64_t reached;  /* the newest generation a queue has run */
  uint64_t stream;   /* id of the stream of the latest record (0: never recorded) */
  int64_t stamp_ns;  /* when the newest reached record ran */
};

enum op_kind { OP_COPY, OP_FILL, OP_RECORD, OP_WAIT, OP_CALLBACK };

struct op {
  struct op *next;
  enum op_kind kind;
  uint8_t *dst;
  const uint8_t *src;
  uint64_t len;
  uint32_t width, value;
  uh_mem *mem[2];     /* references held until the operation ran */
  uh_host_mem *host;
  uh_event *event;
  uint64_t generation;
  uh_host_fn fn;
  void *user;
};

struct uh_stream {
  uint32_t device;
  uint64_t id;
  _Atomic uint32_t refs; /* the handle, the queue thread, device synchronizations under way */
  pthread_mutex_t mu;
  pthread_cond_t work; /* the queue thread waits for operations */
  pthread_cond_t idle; /* synchronizations wait for completions */
  struct op *head, *tail;
  uint64_t submitted, completed;
  int released;
  struct uh_stream *next_live; /* the list of live streams (device synchronize) */
};

static _Atomic uint64_t used[N_DEVICES];
static _Atomic uint64_t next_stream_id = 1;
static struct uh_device devices[N_DEVICES] = {{0}, {1}};
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct uh_stream *live; /* every stream whose queue thread has not exited */
static _Thread_local struct uh_stream *on_queue; /* the stream whose thread this is */

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

static uh_status own_queue(uh_error *err, const char *what) {
  char msg[256];
  snprintf(msg, sizeof msg,
           "%s from a host callback of the same stream: the callback runs on the stream's queue, "
           "so the wait would never end",
           what);
  return fail(err, UH_ERR_INVALID_ARGUMENT, UH_INVALID_OTHER, "stream", msg);
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* ---- references ------------------------------------------------------------------------- */

static void mem_unref(uh_mem *m) {
  if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
    atomic_fetch_sub(&used[m->device], m->len);
    free(m->ptr);
    free(m);
  }
}

static void host_unref(uh_host_mem *h) {
  if (h && atomic_fetch_sub(&h->refs, 1) == 1) {
    free(h->ptr);
    free(h);
  }
}

static void event_unref(uh_event *e) {
  if (e && atomic_fetch_sub(&e->refs, 1) == 1) {
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
  }
}

static void stream_unref(uh_stream *s) {
  if (atomic_fetch_sub(&s->refs, 1) == 1) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    free(s);
  }
}

/* ---- the queue -------------------------------------------------------------------------- */

static void run(struct op *o) {
  switch (o->kind) {
  case OP_COPY:
    if (o->len) memmove(o->dst, o->src, o->len);
    break;
  case OP_FILL:
    for (uint64_t i = 0; i < o->len; i += o->width) memcpy(o->dst + i, &o->value, o->width); /* little-endian */
    break;
  case OP_RECORD: /* under the stream's lock, with the completion count (queue_thread) */
    break;
  case OP_WAIT: {
    uh_event *e = o->event;
    pthread_mutex_lock(&e->mu);
    while (e->reached < o->generation) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    break;
  }
  case OP_CALLBACK:
    o->fn(o->user, UH_OK);
    break;
  }
}

/* Takes `s` off the list of live streams. */
static void unlist(uh_stream *s) {
  pthread_mutex_lock(&live_mu);
  for (uh_stream **p = &live; *p; p = &(*p)->next_live) {
    if (*p == s) {
      *p = s->next_live;
      break;
    }
  }
  pthread_mutex_unlock(&live_mu);
}

static void *queue_thread(void *arg) {
  uh_stream *s = arg;
  on_queue = s;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->released) pthread_cond_wait(&s->work, &s->mu);
    struct op *o = s->head;
    if (!o) break; /* released, and everything queued has run */
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    run(o);
    mem_unref(o->mem[0]);
    mem_unref(o->mem[1]);
    host_unref(o->host);
    pthread_mutex_lock(&s->mu);
    s->completed++;
    if (o->kind == OP_RECORD) {
      /* Reached together with the count: whoever sees the event complete sees the stream's
       * work up to it complete too (stream_query). */
      uh_event *e = o->event;
      pthread_mutex_lock(&e->mu);
      if (o->generation > e->reached) { /* an older record running late changes nothing */
        e->reached = o->generation;
        e->stamp_ns = now_ns();
      }
      pthread_cond_broadcast(&e->cv);
      pthread_mutex_unlock(&e->mu);
    }
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    event_unref(o->event);
    free(o);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  unlist(s);
  on_queue = NULL;
  stream_unref(s);
  return NULL;
}

static struct op *new_op(enum op_kind kind) {
  struct op *o = calloc(1, sizeof *o);
  if (o) o->kind = kind;
  return o;
}

/* Appends `o` (its references taken) to the stream's queue. */
static void enqueue(uh_stream *s, struct op *o) {
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  s->submitted++;
  pthread_cond_signal(&s->work);
  pthread_mutex_unlock(&s->mu);
}

/* Waits until the work enqueued on `s` before the call has run. */
static void drain(uh_stream *s) {
  pthread_mutex_lock(&s->mu);
  uint64_t target = s->submitted;
  while (s->completed < target) pthread_cond_wait(&s->idle, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

/* ---- backend and devices ---------------------------------------------------------------- */

static const char manifest[] =
    "unsupported kernels.* the asynchronous C plugin loads no modules\n"
    "unsupported ops.* the asynchronous C plugin has no library ops\n"
    "unsupported ccl.* the asynchronous C plugin has no collective engine\n";

static const uh_library_info libraries[] = {
    {sizeof(uh_library_info), 0, "runtime", "POSIX threads", "libc", NULL, NULL},
};

static const uh_plugin_info plugin_info = {
    sizeof(uh_plugin_info), 0, NAME, "0.1.0-async-c", 0, 1, 1, 0, libraries, manifest,
};

static const uh_plugin_info *info(void) { return &plugin_info; }

static uh_status probe(uint32_t *count, uh_error *err) {
  (void)err;
  *count = N_DEVICES;
  return UH_OK;
}

static uh_status device_open(uint32_t ordinal, uh_device **out, uh_error *err) {
  if (ordinal >= N_DEVICES) return fail(err, UH_ERR_INVALID_ARGUMENT, UH_INVALID_OTHER, "ordinal", "no such device");
  *out = &devices[ordinal];
  return UH_OK;
}

static void device_release(uh_device *dev) { (void)dev; }

static const char *names[N_DEVICES] = {"asynchronous C device 0", "asynchronous C device 1"};

static uh_status device_props(uh_device *dev, uh_device_props *p, uh_error *err) {
  (void)err;
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
  p->flags = UH_CAP_EVENT_TIMING | UH_CAP_WIDE_FILL | UH_CAP_HOST_CALLBACKS;
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
  if (on_queue && on_queue->device == dev->ordinal) return own_queue(err, "device synchronize");
  /* Take a reference to every live stream of the device, then wait for each outside the lock
   * (a callback may create streams meanwhile). */
  enum { BATCH = 64 };
  uh_stream *batch[BATCH];
  uint64_t seen_below = UINT64_MAX; /* streams are listed newest first: ids strictly fall */
  for (;;) {
    size_t n = 0;
    pthread_mutex_lock(&live_mu);
    for (uh_stream *s = live; s && n < BATCH; s = s->next_live) {
      if (s->device == dev->ordinal && s->id < seen_below) {
        atomic_fetch_add(&s->refs, 1);
        batch[n++] = s;
      }
    }
    pthread_mutex_unlock(&live_mu);
    if (n == 0) return UH_OK;
    for (size_t i = 0; i < n; i++) {
      drain(batch[i]);
      seen_below = batch[i]->id;
      stream_unref(batch[i]);
    }
  }
}

/* ---- memory ----------------------------------------------------------------------------- */

static uh_status mem_alloc(uh_device *dev, uint64_t len, uh_mem **out, uint64_t *addr, uh_error *err) {
  uint64_t before = atomic_fetch_add(&used[dev->ordinal], len);
  if (len > MEMORY_BYTES || before > MEMORY_BYTES - len) {
    atomic_fetch_sub(&used[dev->ordinal], len);
    if (err) {
      err->num[0] = len;
      err->num[1] = before > MEMORY_BYTES ? 0 : MEMORY_BYTES - before;
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
  atomic_init(&m->refs, 1);
  *out = m;
  *addr = (uint64_t)(uintptr_t)p;
  return UH_OK;
}

/* Never waits: queued work that uses the memory holds its own references. */
static void mem_release(uh_mem *m) { mem_unref(m); }

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
  atomic_init(&h->refs, 1);
  *out = h;
  *ptr = p;
  return UH_OK;
}

static void host_release(uh_host_mem *h) { host_unref(h); }

/* ---- streams ---------------------------------------------------------------------------- */

static uh_status stream_create(uh_device *dev, uh_stream **out, uh_error *err) {
  uh_stream *s = calloc(1, sizeof *s);
  if (!s) return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "malloc failed");
  s->device = dev->ordinal;
  s->id = atomic_fetch_add(&next_stream_id, 1);
  atomic_init(&s->refs, 2); /* the handle and the queue thread */
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work, NULL);
  pthread_cond_init(&s->idle, NULL);
  pthread_mutex_lock(&live_mu);
  s->next_live = live;
  live = s;
  pthread_mutex_unlock(&live_mu);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int rc = pthread_create(&t, &attr, queue_thread, s);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    unlist(s);
    stream_unref(s);
    stream_unref(s);
    return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "pthread_create failed");
  }
  *out = s;
  return UH_OK;
}

/* Never waits: the queue thread runs what is queued, then frees the stream. */
static void stream_release(uh_stream *s) {
  pthread_mutex_lock(&s->mu);
  s->released = 1;
  pthread_cond_signal(&s->work);
  pthread_mutex_unlock(&s->mu);
  stream_unref(s);
}

static uh_status copy(uh_stream *s, uint8_t *dst, const uint8_t *src, uint64_t len, uh_mem *m0,
                      uh_mem *m1, uh_host_mem *h, uh_error *err) {
  struct op *o = new_op(OP_COPY);
  if (!o) return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "malloc failed");
  o->dst = dst;
  o->src = src;
  o->len = len;
  if (m0) atomic_fetch_add(&m0->refs, 1);
  if (m1) atomic_fetch_add(&m1->refs, 1);
  if (h) atomic_fetch_add(&h->refs, 1);
  o->mem[0] = m0;
  o->mem[1] = m1;
  o->host = h;
  enqueue(s, o);
  return UH_OK;
}

static uh_status copy_h2d(uh_stream *s, uh_host_mem *src, uint64_t so, uh_mem *dst, uint64_t doff, uint64_t len, uh_error *err) {
  uh_status r = range(err, "src", so, len, src->len);
  if (r == UH_OK) r = range(err, "dst", doff, len, dst->len);
  if (r != UH_OK) return r;
  return copy(s, dst->ptr + doff, src->ptr + so, len, dst, NULL, src, err);
}

static uh_status copy_d2h(uh_stream *s, uh_mem *src, uint64_t so, uh_host_mem *dst, uint64_t doff, uint64_t len, uh_error *err) {
  uh_status r = range(err, "src", so, len, src->len);
  if (r == UH_OK) r = range(err, "dst", doff, len, dst->len);
  if (r != UH_OK) return r;
  return copy(s, dst->ptr + doff, src->ptr + so, len, src, NULL, dst, err);
}

static uh_status copy_d2d(uh_stream *s, uh_mem *src, uint64_t so, uh_mem *dst, uint64_t doff, uint64_t len, uh_error *err) {
  uh_status r = range(err, "src", so, len, src->len);
  if (r == UH_OK) r = range(err, "dst", doff, len, dst->len);
  if (r != UH_OK) return r;
  return copy(s, dst->ptr + doff, src->ptr + so, len, src, dst, NULL, err);
}

static uh_status fill(uh_stream *s, uh_mem *dst, uint64_t off, uint64_t len, uint32_t width, uint32_t value, uh_error *err) {
  uh_status r = range(err, "dst", off, len, dst->len);
  if (r != UH_OK) return r;
  if ((width != 1 && width != 2 && width != 4) || off % width || len % width)
    return fail(err, UH_ERR_INVALID_ARGUMENT, UH_INVALID_OTHER, "len", "not a multiple of the pattern width");
  struct op *o = new_op(OP_FILL);
  if (!o) return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "malloc failed");
  o->dst = dst->ptr + off;
  o->len = len;
  o->width = width;
  o->value = value;
  atomic_fetch_add(&dst->refs, 1);
  o->mem[0] = dst;
  enqueue(s, o);
  return UH_OK;
}

/* Runs on the stream's thread once the work before it ran; called exactly once either way. */
static uh_status host_callback(uh_stream *s, uh_host_fn fn, void *user, uh_error *err) {
  struct op *o = new_op(OP_CALLBACK);
  if (!o) {
    fn(user, UH_ERR_OUT_OF_MEMORY); /* it will never run: the host frees `user` there */
    return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "malloc failed");
  }
  o->fn = fn;
  o->user = user;
  enqueue(s, o);
  return UH_OK;
}

static uh_status stream_synchronize(uh_stream *s, uh_error *err) {
  if (on_queue == s) return own_queue(err, "stream synchronize");
  drain(s);
  return UH_OK; /* no queued operation here can fail, so there is no sticky error */
}

static uh_status stream_query(uh_stream *s, uint32_t *done, uh_error *err) {
  (void)err;
  pthread_mutex_lock(&s->mu);
  *done = s->completed == s->submitted;
  pthread_mutex_unlock(&s->mu);
  return UH_OK;
}

static uh_status stream_async_error(uh_stream *s, uh_error *err) {
  (void)s;
  (void)err;
  return UH_OK;
}

/* ---- events ----------------------------------------------------------------------------- */

static uh_status event_create(uh_device *dev, uint32_t flags, uh_event **out, uh_error *err) {
  uh_event *e = calloc(1, sizeof *e);
  if (!e) return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "malloc failed");
  e->device = dev->ordinal;
  e->flags = flags;
  atomic_init(&e->refs, 1);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  *out = e;
  return UH_OK;
}

static void event_release(uh_event *e) { event_unref(e); }

static uh_status event_record(uh_stream *s, uh_event *e, uh_error *err) {
  struct op *o = new_op(OP_RECORD);
  if (!o) return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "malloc failed");
  atomic_fetch_add(&e->refs, 1);
  o->event = e;
  /* The generation and the enqueue under the stream's lock: records of one stream reach the
   * queue in generation order. */
  pthread_mutex_lock(&s->mu);
  pthread_mutex_lock(&e->mu);
  o->generation = ++e->recorded;
  e->stream = s->id;
  pthread_mutex_unlock(&e->mu);
  if (s->tail) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  s->submitted++;
  pthread_cond_signal(&s->work);
  pthread_mutex_unlock(&s->mu);
  return UH_OK;
}

static uh_status stream_wait_event(uh_stream *s, uh_event *e, uh_error *err) {
  pthread_mutex_lock(&e->mu);
  uint64_t generation = e->recorded;
  uint64_t reached = e->reached;
  pthread_mutex_unlock(&e->mu);
  if (reached >= generation) return UH_OK; /* never recorded, or its work has run */
  struct op *o = new_op(OP_WAIT);
  if (!o) return fail(err, UH_ERR_OUT_OF_MEMORY, 0, NULL, "malloc failed");
  atomic_fetch_add(&e->refs, 1);
  o->event = e;
  o->generation = generation;
  enqueue(s, o);
  return UH_OK;
}

static uh_status event_query(uh_event *e, uint32_t *done, uh_error *err) {
  (void)err;
  pthread_mutex_lock(&e->mu);
  *done = e->reached >= e->recorded;
  pthread_mutex_unlock(&e->mu);
  return UH_OK;
}

static uh_status event_synchronize(uh_event *e, uh_error *err) {
  pthread_mutex_lock(&e->mu);
  if (on_queue && e->stream == on_queue->id && e->reached < e->recorded) {
    pthread_mutex_unlock(&e->mu);
    return own_queue(err, "event synchronize");
  }
  uint64_t generation = e->recorded;
  while (e->reached < generation) pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
  return UH_OK;
}

static uh_status event_elapsed(uh_event *a, uh_event *b, float *ms, uh_error *err) {
  int64_t t[2];
  uh_event *ev[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    pthread_mutex_lock(&ev[i]->mu);
    int never = ev[i]->recorded == 0, pending = ev[i]->reached < ev[i]->recorded;
    t[i] = ev[i]->stamp_ns;
    pthread_mutex_unlock(&ev[i]->mu);
    const char *arg = i == 0 ? "start" : "end";
    if (never) return fail(err, UH_ERR_INVALID_ARGUMENT, UH_INVALID_OTHER, arg, "an event that was never recorded");
    if (pending) return fail(err, UH_ERR_INVALID_ARGUMENT, UH_INVALID_OTHER, arg, "an event whose work has not completed");
  }
  *ms = (float)((double)(t[1] - t[0]) / 1e6);
  return UH_OK;
}

static const uh_plugin_api table = {
    .size = sizeof(uh_plugin_api),
    .abi_major = UH_ABI_MAJOR,
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
    .stream_create = stream_create,
    .stream_release = stream_release,
    .copy_h2d = copy_h2d,
    .copy_d2h = copy_d2h,
    .copy_d2d = copy_d2d,
    .fill = fill,
    .host_callback = host_callback,
    .stream_synchronize = stream_synchronize,
    .stream_query = stream_query,
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
  if (!host || host->abi_major != UH_ABI_MAJOR) {
    fail(err, UH_ERR_ABI_MISMATCH, 0, NULL, "the host speaks another plugin ABI major");
    return NULL;
  }
  if (host->log) host->log(UH_LOG_INFO, NAME, "asynchronous C plugin loaded");
  return &table;
}
