// tcpx::Endpoint and friends: the public API's thin layer over the engine (engine.h).
#include <utility>

#include "common/status_util.h"
#include "engine/engine.h"
#include "engine/metadata.h"
#include "tcpx/endpoint.h"

namespace tcpx {
namespace {

// No exception leaves this API (endpoint.h): one from inside a call (out of memory) becomes its
// error. Progress inside a call lets none out either (Impl::progress_once), so a call that fails
// this way has not left a transfer of the caller's in an unknown state.
template <typename F>
auto guarded(const char* what, F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (...) {
        return status_of_current_exception(what);
    }
}

}  // namespace

StatusOr<std::unique_ptr<Endpoint>> Endpoint::create(const Config& config, std::string name) {
    return guarded("create", [&]() -> StatusOr<std::unique_ptr<Endpoint>> {
        TCPX_ASSIGN_OR_RETURN(auto impl, Impl::create(config, std::move(name)));
        return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
    });
}

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Endpoint::~Endpoint() = default;

const std::string& Endpoint::name() const { return impl_->name(); }
std::string Endpoint::metadata() const { return impl_->metadata(); }

StatusOr<EndpointInfo> Endpoint::parse_metadata(std::string_view metadata) {
    return guarded("parse_metadata", [&]() -> StatusOr<EndpointInfo> {
        TCPX_ASSIGN_OR_RETURN(engine::EndpointAddress a, engine::decode_metadata(metadata));
        EndpointInfo info;
        info.name = a.name;
        info.host = a.address.host_string();
        info.port = a.address.port();
        info.gpu = a.gpu;
        return info;
    });
}

StatusOr<PeerId> Endpoint::connect(std::string_view metadata) {
    return guarded("connect", [&] { return impl_->connect(metadata); });
}
StatusOr<PeerId> Endpoint::connect_async(std::string_view metadata) {
    return guarded("connect_async", [&] { return impl_->connect_async(metadata); });
}
StatusOr<PeerId> Endpoint::accept(std::chrono::milliseconds timeout) {
    return guarded("accept", [&] { return impl_->accept(timeout); });
}
Status Endpoint::disconnect(PeerId peer) {
    return guarded("disconnect", [&] { return impl_->disconnect(peer); });
}
StatusOr<std::string> Endpoint::peer_name(PeerId peer) const {
    return guarded("peer_name", [&] { return impl_->peer_name(peer); });
}
Status Endpoint::peer_matches(PeerId peer, std::string_view metadata) const {
    return guarded("peer_matches", [&] { return impl_->peer_matches(peer, metadata); });
}
Status Endpoint::peer_status(PeerId peer) {
    return guarded("peer_status", [&] { return impl_->peer_status(peer); });
}
Stats Endpoint::stats() const { return impl_->stats(); }
StatusOr<Stats> Endpoint::peer_stats(PeerId peer) const {
    return guarded("peer_stats", [&] { return impl_->peer_stats(peer); });
}

StatusOr<MemId> Endpoint::reg(void* ptr, size_t len) {
    return guarded("reg", [&] { return impl_->reg(ptr, len); });
}
Status Endpoint::dereg(MemId mem) {
    return guarded("dereg", [&] { return impl_->dereg(mem); });
}
StatusOr<RemoteMem> Endpoint::describe(MemId mem) const {
    return guarded("describe", [&] { return impl_->describe(mem); });
}

StatusOr<XferId> Endpoint::write(PeerId peer, MemId mem, uint64_t offset, const RemoteMem& remote,
                                 uint64_t remote_offset, uint64_t len,
                                 std::optional<std::string_view> notification) {
    const IoVec one{mem, offset, remote, remote_offset, len};
    return guarded(
        "write", [&] { return impl_->write(peer, std::span<const IoVec>(&one, 1), notification); });
}

StatusOr<XferId> Endpoint::read(PeerId peer, MemId mem, uint64_t offset, const RemoteMem& remote,
                                uint64_t remote_offset, uint64_t len,
                                std::optional<std::string_view> notification) {
    const IoVec one{mem, offset, remote, remote_offset, len};
    return guarded(
        "read", [&] { return impl_->read(peer, std::span<const IoVec>(&one, 1), notification); });
}

StatusOr<XferId> Endpoint::writev(PeerId peer, std::span<const IoVec> iov,
                                  std::optional<std::string_view> notification) {
    return guarded("writev", [&] { return impl_->write(peer, iov, notification); });
}

StatusOr<XferId> Endpoint::readv(PeerId peer, std::span<const IoVec> iov,
                                 std::optional<std::string_view> notification) {
    return guarded("readv", [&] { return impl_->read(peer, iov, notification); });
}

Status Endpoint::copy(std::span<const LocalCopy> pieces) {
    return guarded("copy", [&] { return impl_->copy(pieces); });
}

Status Endpoint::notify(PeerId peer, std::string_view payload) {
    return guarded("notify", [&] { return impl_->notify(peer, payload); });
}
std::vector<Notification> Endpoint::get_notifications(size_t max) {
    return impl_->get_notifications(max);
}

StatusOr<XferId> Endpoint::send(PeerId peer, MemId mem, uint64_t offset, uint64_t len,
                                uint64_t tag) {
    return guarded("send", [&] { return impl_->send(peer, mem, offset, len, tag); });
}

StatusOr<XferId> Endpoint::recv(PeerId peer, MemId mem, uint64_t offset, uint64_t len,
                                uint64_t tag) {
    return guarded("recv", [&] { return impl_->recv(peer, mem, offset, len, tag); });
}

TcpxSession Endpoint::session(PeerId peer) { return TcpxSession(this, peer); }

XferStatus Endpoint::poll(XferId xfer) { return impl_->poll(xfer); }
Status Endpoint::cancel(XferId xfer) {
    return guarded("cancel", [&] { return impl_->cancel(xfer); });
}
Status Endpoint::wait(XferId xfer, std::chrono::milliseconds timeout) {
    return guarded("wait", [&] { return impl_->wait(xfer, timeout); });
}

// --- sessions
// --------------------------------------------------------------------------------------

namespace {

StatusOr<TcpxTransfer> as_transfer(Endpoint* ep, StatusOr<XferId> id) {
    if (!id.ok()) return std::move(id).status();
    return TcpxTransfer(ep, *id);
}

}  // namespace

StatusOr<TcpxTransfer> TcpxSession::send(MemId mem, uint64_t offset, uint64_t len, uint64_t tag) {
    return as_transfer(endpoint_, endpoint_->send(peer_, mem, offset, len, tag));
}

StatusOr<TcpxTransfer> TcpxSession::recv(MemId mem, uint64_t offset, uint64_t len, uint64_t tag) {
    return as_transfer(endpoint_, endpoint_->recv(peer_, mem, offset, len, tag));
}

StatusOr<TcpxTransfer> TcpxSession::write(MemId mem, uint64_t offset, const RemoteMem& remote,
                                          uint64_t remote_offset, uint64_t len,
                                          std::optional<std::string_view> notification) {
    return as_transfer(
        endpoint_, endpoint_->write(peer_, mem, offset, remote, remote_offset, len, notification));
}

StatusOr<TcpxTransfer> TcpxSession::read(MemId mem, uint64_t offset, const RemoteMem& remote,
                                         uint64_t remote_offset, uint64_t len,
                                         std::optional<std::string_view> notification) {
    return as_transfer(
        endpoint_, endpoint_->read(peer_, mem, offset, remote, remote_offset, len, notification));
}

}  // namespace tcpx
