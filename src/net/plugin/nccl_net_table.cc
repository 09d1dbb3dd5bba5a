#include "net/plugin/nccl_net_table.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "common/log.h"
#include "net/ncclnet_newer.h"
#include "net/v7_common.h"

namespace tcpx::net {
namespace {

// A plugin's call, with any C++ exception it lets out taken for an internal error: one thrown
// through the caller's frames would end the application (the engine's teardown, which closes
// comms, cannot throw) or leave a peer's teardown retrying the same call for ever.
template <typename F>
tcpx_ncclResult_t guarded(const char* call, F&& f) noexcept {
    try {
        return f();
    } catch (...) {
        TCPX_WARN("net plugin: %s threw an exception (taken for an internal error)", call);
        return tcpx_ncclInternalError;
    }
}

template <int V>
struct Abi;
template <>
struct Abi<7> {
    using Table = tcpx_ncclNet_v7_t;
    using Props = tcpx_ncclNetProperties_v7_t;
};
template <>
struct Abi<8> {
    using Table = tcpx_ncclNet_v8_t;
    using Props = tcpx_ncclNetProperties_v8_t;
};
template <>
struct Abi<9> {
    using Table = tcpx_ncclNet_v9_t;
    using Props = tcpx_ncclNetProperties_v9_t;
};
template <>
struct Abi<10> {
    using Table = tcpx_ncclNet_v10_t;
    using Props = tcpx_ncclNetProperties_v10_t;
};
template <>
struct Abi<11> {
    using Table = tcpx_ncclNet_v11_t;
    using Props = tcpx_ncclNetProperties_v11_t;
};
template <>
struct Abi<12> {
    using Table = tcpx_ncclNet_v12_t;
    using Props = tcpx_ncclNetProperties_v12_t;
};

// Plugins from v10 on report events to NCCL's profiler through this callback (NCCL's own
// transports call it unconditionally). There is no NCCL profiler here: events are dropped.
tcpx_ncclResult_t drop_profiler_event(void** event, int /*type*/, void* /*phandle*/,
                                      int64_t /*plugin_id*/, void* /*ext_data*/) {
    if (event != nullptr) *event = nullptr;
    return tcpx_ncclSuccess;
}

// One ncclNet version in v7's shape. What changed when is listed in ncclnet_newer.h; the
// constants below name each difference once.
template <int V>
class Adapter final : public NcclNetTable {
    using Table = typename Abi<V>::Table;
    using Props = typename Abi<V>::Props;
    static constexpr bool kIntRegSize = V < 8;
    static constexpr bool kIntTransferSizes = V < 9;
    static constexpr bool kNewProps = V >= 9;  // forceFlush, maxP2pBytes
    static constexpr bool kProfiler = V >= 10;
    static constexpr bool kContext = V >= 11;
    using TransferSize = std::conditional_t<kIntTransferSizes, int, size_t>;

 public:
    explicit Adapter(const Table* table) : t_(table) {}

    int version() const override { return V; }
    const char* name() const override { return t_->name; }

    const char* missing_function() const override {
        const std::pair<const char*, bool> required[] = {
            {"init", t_->init != nullptr},
            {"devices", t_->devices != nullptr},
            {"getProperties", t_->getProperties != nullptr},
            {"listen", t_->listen != nullptr},
            {"connect", t_->connect != nullptr},
            {"accept", t_->accept != nullptr},
            {"regMr", t_->regMr != nullptr},
            {"deregMr", t_->deregMr != nullptr},
            {"isend", t_->isend != nullptr},
            {"irecv", t_->irecv != nullptr},
            {"test", t_->test != nullptr},
            {"closeSend", t_->closeSend != nullptr},
            {"closeRecv", t_->closeRecv != nullptr},
            {"closeListen", t_->closeListen != nullptr},
        };
        for (const auto& [fn, present] : required) {
            if (!present) return fn;
        }
        return nullptr;
    }

    bool has_irecv_consumed() const override { return t_->irecvConsumed != nullptr; }

    size_t max_reg_bytes() const override {
        return kIntRegSize ? static_cast<size_t>(INT_MAX) : SIZE_MAX;
    }

    size_t max_transfer_bytes(int ndev) const override {
        size_t limit = static_cast<size_t>(INT_MAX);
        if constexpr (kNewProps) {
            for (int dev = 0; dev < ndev; ++dev) {
                Props p{};
                // NCCL refuses a plugin reporting 0; here it reads as "not stated".
                if (nccl_call_ok(
                        guarded("getProperties", [&] { return t_->getProperties(dev, &p); })) &&
                    p.maxP2pBytes > 0) {
                    limit = std::min(limit, p.maxP2pBytes);
                }
            }
        }
        return limit;
    }

    tcpx_ncclResult_t init(tcpx_ncclDebugLogger_t logger) override {
        if constexpr (kContext) {
            // v11 expects an init per NCCL communicator, and a commId naming it. There is none
            // here: one context serves the process and is never finalized (the plugin is never
            // unloaded).
            return guarded("init", [&] {
                return t_->init(&ctx_, /*commId=*/0, &config_, logger, &drop_profiler_event);
            });
        } else if constexpr (kProfiler) {
            return guarded("init", [&] { return t_->init(logger, &drop_profiler_event); });
        } else {
            return guarded("init", [&] { return t_->init(logger); });
        }
    }

    tcpx_ncclResult_t devices(int* ndev) const override { return t_->devices(ndev); }

    tcpx_ncclResult_t get_properties(int dev, tcpx_ncclNetProperties_v7_t* out) const override {
        if constexpr (V == 7) {
            return guarded("getProperties", [&] { return t_->getProperties(dev, out); });
        } else {
            Props p{};
            const tcpx_ncclResult_t rc =
                guarded("getProperties", [&] { return t_->getProperties(dev, &p); });
            if (!nccl_call_ok(rc)) return rc;
            *out = tcpx_ncclNetProperties_v7_t{};
            out->name = p.name;
            out->pciPath = p.pciPath;
            out->guid = p.guid;
            out->ptrSupport = p.ptrSupport;
            out->speed = p.speed;
            out->port = p.port;
            out->latency = p.latency;
            out->maxComms = p.maxComms;
            out->maxRecvs = p.maxRecvs;
            out->netDeviceType = p.netDeviceType;
            out->netDeviceVersion = p.netDeviceVersion;
            if constexpr (kNewProps) {
                constexpr int kDevicePointers = TCPX_NCCL_PTR_CUDA | TCPX_NCCL_PTR_DMABUF;
                if (p.forceFlush != 0 && (out->ptrSupport & kDevicePointers) != 0) {
                    out->ptrSupport &= ~kDevicePointers;
                    if (!warned_force_flush_.exchange(true)) {
                        TCPX_WARN(
                            "net plugin %s: device %d needs iflush() after CUDA receives "
                            "(forceFlush); CUDA memory goes through host staging instead",
                            t_->name != nullptr ? t_->name : "(unnamed)", dev);
                    }
                }
            }
            return rc;
        }
    }

    tcpx_ncclResult_t listen(int dev, void* handle, void** listen_comm) const override {
        if constexpr (kContext) {
            return guarded("listen", [&] { return t_->listen(ctx_, dev, handle, listen_comm); });
        } else {
            return guarded("listen", [&] { return t_->listen(dev, handle, listen_comm); });
        }
    }

    tcpx_ncclResult_t connect(int dev, void* handle, void** send_comm,
                              tcpx_ncclNetDeviceHandle_v7_t** dev_handle) const override {
        if constexpr (kContext) {
            return guarded("connect",
                           [&] { return t_->connect(ctx_, dev, handle, send_comm, dev_handle); });
        } else if constexpr (kProfiler) {  // v10: the config travels with each connect
            return guarded("connect", [&] {
                return t_->connect(dev, &config_, handle, send_comm, dev_handle);
            });
        } else {
            return guarded("connect",
                           [&] { return t_->connect(dev, handle, send_comm, dev_handle); });
        }
    }

    tcpx_ncclResult_t accept(void* listen_comm, void** recv_comm,
                             tcpx_ncclNetDeviceHandle_v7_t** dev_handle) const override {
        return guarded("accept", [&] { return t_->accept(listen_comm, recv_comm, dev_handle); });
    }

    tcpx_ncclResult_t reg_mr(void* comm, void* data, size_t size, int type,
                             void** mhandle) const override {
        using RegSize = std::conditional_t<kIntRegSize, int, size_t>;
        return guarded("regMr", [&] {
            return t_->regMr(comm, data, static_cast<RegSize>(size), type, mhandle);
        });
    }

    tcpx_ncclResult_t dereg_mr(void* comm, void* mhandle) const override {
        return guarded("deregMr", [&] { return t_->deregMr(comm, mhandle); });
    }

    tcpx_ncclResult_t isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                            void** request) const override {
        const auto sz = static_cast<TransferSize>(size);
        if constexpr (kProfiler) {
            return guarded("isend", [&] {
                return t_->isend(send_comm, data, sz, tag, mhandle, /*phandle=*/nullptr, request);
            });
        } else {
            return guarded("isend",
                           [&] { return t_->isend(send_comm, data, sz, tag, mhandle, request); });
        }
    }

    tcpx_ncclResult_t irecv(void* recv_comm, int n, void** data, const size_t* sizes, int* tags,
                            void** mhandles, void** request) const override {
        TransferSize sz[kMaxRecvBuffers];
        for (int i = 0; i < n; ++i) sz[i] = static_cast<TransferSize>(sizes[i]);
        if constexpr (kProfiler) {
            // NCCL passes one profiler handle per buffer; plugins index the array.
            void* phandles[kMaxRecvBuffers] = {};
            return guarded("irecv", [&] {
                return t_->irecv(recv_comm, n, data, sz, tags, mhandles, phandles, request);
            });
        } else {
            return guarded("irecv", [&] {
                return t_->irecv(recv_comm, n, data, sz, tags, mhandles, request);
            });
        }
    }

    tcpx_ncclResult_t test(void* request, int* done, int* sizes) const override {
        return guarded("test", [&] { return t_->test(request, done, sizes); });
    }
    tcpx_ncclResult_t irecv_consumed(void* recv_comm, int n, void* request) const override {
        return guarded("irecvConsumed", [&] { return t_->irecvConsumed(recv_comm, n, request); });
    }
    tcpx_ncclResult_t close_send(void* send_comm) const override {
        return guarded("closeSend", [&] { return t_->closeSend(send_comm); });
    }
    tcpx_ncclResult_t close_recv(void* recv_comm) const override {
        return guarded("closeRecv", [&] { return t_->closeRecv(recv_comm); });
    }
    tcpx_ncclResult_t close_listen(void* listen_comm) const override {
        return guarded("closeListen", [&] { return t_->closeListen(listen_comm); });
    }

 private:
    const Table* const t_;
    void* ctx_ = nullptr;  // v11: what init() returned
    // v10's connect and v11's init take a config; NCCL's default leaves the traffic class unset.
    mutable tcpx_ncclNetCommConfig_t config_{TCPX_NCCL_NET_TRAFFIC_CLASS_UNDEF};
    mutable std::atomic<bool> warned_force_flush_{false};
};

template <int V>
std::unique_ptr<NcclNetTable> make_adapter(const void* table) {
    return std::make_unique<Adapter<V>>(static_cast<const typename Abi<V>::Table*>(table));
}

std::unique_ptr<NcclNetTable> make_adapter(const void* table, int version) {
    static_assert(kOldestNcclNetVersion == 7 && kNewestNcclNetVersion == 12,
                  "one case per version below");
    switch (version) {
        case 7:
            return make_adapter<7>(table);
        case 8:
            return make_adapter<8>(table);
        case 9:
            return make_adapter<9>(table);
        case 10:
            return make_adapter<10>(table);
        case 11:
            return make_adapter<11>(table);
        case 12:
            return make_adapter<12>(table);
        default:
            return nullptr;
    }
}

}  // namespace

NcclNetTable* nccl_net_table(const void* table, int version) {
    if (table == nullptr) return nullptr;
    static std::mutex mu;
    static auto* adapters =
        new std::map<std::pair<const void*, int>, std::unique_ptr<NcclNetTable>>;
    std::lock_guard<std::mutex> lock(mu);
    auto it = adapters->find({table, version});
    if (it == adapters->end()) {
        auto adapter = make_adapter(table, version);
        if (!adapter) return nullptr;
        it = adapters->emplace(std::pair(table, version), std::move(adapter)).first;
    }
    return it->second.get();
}

}  // namespace tcpx::net
