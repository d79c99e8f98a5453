// unihal's shim over gloo (Debian's libgloo-dev): a C interface to the C++ API, so that the
// CPU backend's gloo engine (gloo/mod.rs, gloo/comm.rs) reaches gloo's TCP transport and
// collectives through plain functions. Every function catches every exception: an error is a
// return code and a message, never an exception crossing into Rust.
//
// Return codes: 0 ok; UH_GLOO_TIMEOUT a deadline passed; UH_GLOO_IO the connection to a peer
// broke (it closed its connections: aborted, or died); UH_GLOO_ERROR anything else.

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr int UH_GLOO_TIMEOUT = 1;
constexpr int UH_GLOO_IO = 2;
constexpr int UH_GLOO_ERROR = 3;

// The store the Rust side serves gloo's rendezvous through (the job's c10d TCPStore).
extern "C" typedef void (*uh_sink_fn)(void* sink, const char* data, size_t len);
extern "C" typedef int (*uh_store_set_fn)(void* user, const char* key, size_t klen,
                                          const char* val, size_t vlen);
extern "C" typedef int (*uh_store_get_fn)(void* user, const char* key, size_t klen,
                                          void* sink, uh_sink_fn put);
extern "C" typedef int (*uh_store_wait_fn)(void* user, const char* const* keys,
                                           const size_t* klens, size_t n, int64_t timeout_ms);

struct StoreFns {
  void* user;
  uh_store_set_fn set;
  uh_store_get_fn get;
  uh_store_wait_fn wait;
};

void put_vector(void* sink, const char* data, size_t len) {
  auto* v = static_cast<std::vector<char>*>(sink);
  v->assign(data, data + len);
}

// gloo's rendezvous::Store over the Rust callbacks; a failing callback throws gloo's IoException
// (the Rust side keeps the store's own error for the message).
class CallbackStore : public gloo::rendezvous::Store {
 public:
  explicit CallbackStore(const StoreFns& fns) : fns_(fns) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    if (fns_.set(fns_.user, key.data(), key.size(), data.data(), data.size()) != 0) {
      throw gloo::IoException("unihal store: set " + key + " failed");
    }
  }

  std::vector<char> get(const std::string& key) override {
    std::vector<char> out;
    if (fns_.get(fns_.user, key.data(), key.size(), &out, put_vector) != 0) {
      throw gloo::IoException("unihal store: get " + key + " failed");
    }
    return out;
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (const auto& k : keys) {
      ptrs.push_back(k.data());
      lens.push_back(k.size());
    }
    if (fns_.wait(fns_.user, ptrs.data(), lens.data(), keys.size(), timeout.count()) != 0) {
      throw gloo::IoException("unihal store: wait failed");
    }
  }

 private:
  StoreFns fns_;
};

void put_error(char* err, size_t errlen, const std::string& msg) {
  if (err == nullptr || errlen == 0) {
    return;
  }
  size_t n = msg.size() < errlen - 1 ? msg.size() : errlen - 1;
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

// Runs `body`, turning every exception into a code and a message.
template <typename F>
int guarded(char* err, size_t errlen, F&& body) {
  try {
    body();
    return 0;
  } catch (const gloo::IoException& e) {
    std::string what = e.what();
    put_error(err, errlen, what);
    return what.find("Timed out") != std::string::npos ? UH_GLOO_TIMEOUT : UH_GLOO_IO;
  } catch (const std::exception& e) {
    std::string what = e.what();
    put_error(err, errlen, what);
    return what.find("Timed out") != std::string::npos ? UH_GLOO_TIMEOUT : UH_GLOO_ERROR;
  } catch (...) {
    put_error(err, errlen, "an unknown exception");
    return UH_GLOO_ERROR;
  }
}

using Ctx = std::shared_ptr<gloo::Context>;

Ctx& ctx_of(void* h) { return *static_cast<Ctx*>(h); }

std::chrono::milliseconds ms(int64_t v) { return std::chrono::milliseconds(v); }

// The element type gloo's templates are given: only its size matters to them.
template <size_t N>
struct Elem {
  char b[N];
};

// Calls `f.template operator()<Elem<elsize>>()` for the element sizes unihal's dtypes have.
template <typename F>
void by_size(size_t elsize, F&& f) {
  switch (elsize) {
    case 1: f(Elem<1>{}); break;
    case 2: f(Elem<2>{}); break;
    case 4: f(Elem<4>{}); break;
    case 8: f(Elem<8>{}); break;
    default: throw std::invalid_argument("an element size gloo is not given: " + std::to_string(elsize));
  }
}

}  // namespace

extern "C" {

// Element-wise c = a (op) b over n elements; `user` says the dtype and operation.
typedef void (*uh_reduce_fn)(const void* user, void* c, const void* a, const void* b, size_t n);

// Connects rank `rank` of `size` in a full mesh over TCP, meeting the others through the store.
// The transport binds `iface` when non-empty, else the address `hostname` resolves to.
int uh_gloo_connect(void* store_user, uh_store_set_fn set, uh_store_get_fn get,
                    uh_store_wait_fn wait, int rank, int size, const char* hostname,
                    const char* iface, int64_t timeout_ms, void** out, char* err,
                    size_t errlen) {
  return guarded(err, errlen, [&] {
    gloo::transport::tcp::attr attr;
    if (iface != nullptr && iface[0] != '\0') {
      attr.iface = iface;
    } else {
      attr.hostname = hostname;
    }
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(ms(timeout_ms));
    CallbackStore store(StoreFns{store_user, set, get, wait});
    ctx->connectFullMesh(store, dev);
    *out = new Ctx(ctx);
  });
}

// Closes every connection of the context: operations waiting on it (here and at the peers)
// end with an I/O error. Safe while an operation runs on another thread.
void uh_gloo_close(void* h) {
  try {
    ctx_of(h)->closeConnections();
  } catch (...) {
  }
}

void uh_gloo_free(void* h) { delete static_cast<Ctx*>(h); }

// Sends `token` to every other rank on `slot` and receives theirs into `tokens` (one per rank);
// `arrived[r]` is set for each rank whose token came. Timeout: UH_GLOO_TIMEOUT, with `arrived`
// naming who came.
int uh_gloo_exchange(void* h, uint64_t token, uint64_t slot, int64_t timeout_ms,
                     uint64_t* tokens, uint8_t* arrived, char* err, size_t errlen) {
  Ctx& c = ctx_of(h);
  const int n = c->size, me = c->rank;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs(n);
  std::unique_ptr<gloo::transport::UnboundBuffer> send;
  uint64_t out = token;
  int rc = guarded(err, errlen, [&] {
    send = c->createUnboundBuffer(&out, sizeof(out));
    for (int r = 0; r < n; r++) {
      arrived[r] = r == me;
      tokens[r] = token;
      if (r == me) continue;
      recvs[r] = c->createUnboundBuffer(&tokens[r], sizeof(uint64_t));
      recvs[r]->recv(r, slot);
      send->send(r, slot);
    }
    auto deadline = std::chrono::steady_clock::now() + ms(timeout_ms);
    for (int r = 0; r < n; r++) {
      if (r == me) continue;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() < 1) left = ms(1);
      recvs[r]->waitRecv(left);
      arrived[r] = 1;
    }
    for (int r = 0; r < n; r++) {
      if (r == me) continue;
      send->waitSend(ms(timeout_ms));
    }
  });
  if (rc != 0) {
    // Nothing may write into `tokens` or read `out` once this returns.
    for (auto& b : recvs) {
      if (b) b->abortWaitRecv();
    }
    if (send) send->abortWaitSend();
  }
  return rc;
}

// In place when `in` is null (the output holds the input).
int uh_gloo_allreduce(void* h, const void* in, void* out, size_t count, size_t elsize,
                      uh_reduce_fn fn, const void* fn_user, uint32_t tag, int64_t timeout_ms,
                      char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    by_size(elsize, [&](auto e) {
      using T = decltype(e);
      gloo::AllreduceOptions opts(ctx_of(h));
      if (in != nullptr) {
        opts.setInput(static_cast<T*>(const_cast<void*>(in)), count);
      }
      opts.setOutput(static_cast<T*>(out), count);
      opts.setReduceFunction([fn, fn_user](void* c, const void* a, const void* b, size_t n) {
        fn(fn_user, c, a, b, n);
      });
      opts.setTag(tag);
      opts.setTimeout(ms(timeout_ms));
      gloo::allreduce(opts);
    });
  });
}

// Reduce to `root` (in place when `in` is null); `out` is written on the root only.
int uh_gloo_reduce(void* h, const void* in, void* out, size_t count, size_t elsize,
                   uh_reduce_fn fn, const void* fn_user, int root, uint32_t tag,
                   int64_t timeout_ms, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    by_size(elsize, [&](auto e) {
      using T = decltype(e);
      gloo::ReduceOptions opts(ctx_of(h));
      if (in != nullptr) {
        opts.setInput(static_cast<T*>(const_cast<void*>(in)), count);
      }
      opts.setOutput(static_cast<T*>(out), count);
      opts.setReduceFunction([fn, fn_user](void* c, const void* a, const void* b, size_t n) {
        fn(fn_user, c, a, b, n);
      });
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(ms(timeout_ms));
      gloo::reduce(opts);
    });
  });
}

// Broadcast `bytes` from `root`'s `in` (null: its `out`) into every rank's `out`.
int uh_gloo_broadcast(void* h, const void* in, void* out, size_t bytes, int root, uint32_t tag,
                      int64_t timeout_ms, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    gloo::BroadcastOptions opts(ctx_of(h));
    if (in != nullptr) {
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes);
    }
    opts.setOutput(static_cast<uint8_t*>(out), bytes);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(ms(timeout_ms));
    gloo::broadcast(opts);
  });
}

// Gathers every rank's `bytes` into `out` (size * bytes), in rank order; in place when `in` is
// null (rank r's part is already at out + r * bytes).
int uh_gloo_allgather(void* h, const void* in, void* out, size_t bytes, uint32_t tag,
                      int64_t timeout_ms, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    gloo::AllgatherOptions opts(ctx_of(h));
    if (in != nullptr) {
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes);
    }
    opts.setOutput(static_cast<uint8_t*>(out), bytes * ctx_of(h)->size);
    opts.setTag(tag);
    opts.setTimeout(ms(timeout_ms));
    gloo::allgather(opts);
  });
}

// All-to-all of `bytes` per rank pair: part r of `in` goes to rank r, part r of `out` comes
// from rank r.
int uh_gloo_alltoall(void* h, const void* in, void* out, size_t bytes, uint32_t tag,
                     int64_t timeout_ms, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    size_t n = static_cast<size_t>(ctx_of(h)->size);
    gloo::AlltoallOptions opts(ctx_of(h));
    opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes * n);
    opts.setOutput(static_cast<uint8_t*>(out), bytes * n);
    opts.setTag(tag);
    opts.setTimeout(ms(timeout_ms));
    gloo::alltoall(opts);
  });
}

// One send or receive of a group.
struct uh_gloo_p2p {
  void* ptr;
  size_t bytes;
  int peer;
  int recv;
  uint64_t slot;
};

// Posts every send and receive of a group, then waits for all of them until the deadline.
// `done[i]` says which completed (a receive that never completed names its peer). On failure
// every pending operation is aborted before returning: nothing touches the buffers after it.
int uh_gloo_p2p(void* h, const uh_gloo_p2p* calls, size_t n, int64_t timeout_ms, uint8_t* done,
                char* err, size_t errlen) {
  Ctx& c = ctx_of(h);
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs(n);
  int rc = guarded(err, errlen, [&] {
    for (size_t i = 0; i < n; i++) {
      done[i] = 0;
      // gloo refuses an empty buffer; an empty message is just a message.
      static uint8_t empty;
      void* p = calls[i].bytes == 0 ? &empty : calls[i].ptr;
      bufs[i] = c->createUnboundBuffer(p, calls[i].bytes);
      if (calls[i].recv) {
        bufs[i]->recv(calls[i].peer, calls[i].slot, 0, calls[i].bytes);
      } else {
        bufs[i]->send(calls[i].peer, calls[i].slot, 0, calls[i].bytes);
      }
    }
    auto deadline = std::chrono::steady_clock::now() + ms(timeout_ms);
    for (size_t i = 0; i < n; i++) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() < 1) left = ms(1);
      if (calls[i].recv) {
        bufs[i]->waitRecv(left);
      } else {
        bufs[i]->waitSend(left);
      }
      done[i] = 1;
    }
  });
  if (rc != 0) {
    for (size_t i = 0; i < n; i++) {
      if (bufs[i] && !done[i]) {
        if (calls[i].recv) {
          bufs[i]->abortWaitRecv();
        } else {
          bufs[i]->abortWaitSend();
        }
      }
    }
  }
  return rc;
}

}  // extern "C"
