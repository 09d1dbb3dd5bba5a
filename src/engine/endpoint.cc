// tcpx::Endpoint and friends: the public API's thin layer over the engine (engine.h).
#include <utility>

#include "common/status_util.h"
#include "engine/engine.h"
#include "engine/metadata.h"
#include "tcpx/endpoint.h"

namespace tcpx {

StatusOr<std::unique_ptr<Endpoint>> Endpoint::create(const Config& config, std::string name) {
    TCPX_ASSIGN_OR_RETURN(auto impl, Impl::create(config, std::move(name)));
    return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Endpoint::~Endpoint() = default;

const std::string& Endpoint::name() const { return impl_->name(); }
std::string Endpoint::metadata() const { return impl_->metadata(); }

StatusOr<EndpointInfo> Endpoint::parse_metadata(std::string_view metadata) {
    TCPX_ASSIGN_OR_RETURN(engine::EndpointAddress a, engine::decode_metadata(metadata));
    EndpointInfo info;
    info.name = a.name;
    info.host = a.address.host_string();
    info.port = a.address.port();
    info.gpu = a.gpu;
    return info;
}

StatusOr<PeerId> Endpoint::connect(std::string_view metadata) { return impl_->connect(metadata); }
StatusOr<PeerId> Endpoint::connect_async(std::string_view metadata) {
    return impl_->connect_async(metadata);
}
StatusOr<PeerId> Endpoint::accept(std::chrono::milliseconds timeout) {
    return impl_->accept(timeout);
}
Status Endpoint::disconnect(PeerId peer) { return impl_->disconnect(peer); }
StatusOr<std::string> Endpoint::peer_name(PeerId peer) const { return impl_->peer_name(peer); }
Status Endpoint::peer_status(PeerId peer) { return impl_->peer_status(peer); }
Stats Endpoint::stats() const { return impl_->stats(); }
StatusOr<Stats> Endpoint::peer_stats(PeerId peer) const { return impl_->peer_stats(peer); }

StatusOr<MemId> Endpoint::reg(void* ptr, size_t len) { return impl_->reg(ptr, len); }
Status Endpoint::dereg(MemId mem) { return impl_->dereg(mem); }
StatusOr<RemoteMem> Endpoint::describe(MemId mem) const { return impl_->describe(mem); }

StatusOr<XferId> Endpoint::write(PeerId peer, MemId mem, uint64_t offset, const RemoteMem& remote,
                                 uint64_t remote_offset, uint64_t len,
                                 std::optional<std::string_view> notification) {
    const IoVec one{mem, offset, remote, remote_offset, len};
    return impl_->write(peer, std::span<const IoVec>(&one, 1), notification);
}

StatusOr<XferId> Endpoint::read(PeerId peer, MemId mem, uint64_t offset, const RemoteMem& remote,
                                uint64_t remote_offset, uint64_t len,
                                std::optional<std::string_view> notification) {
    const IoVec one{mem, offset, remote, remote_offset, len};
    return impl_->read(peer, std::span<const IoVec>(&one, 1), notification);
}

StatusOr<XferId> Endpoint::writev(PeerId peer, std::span<const IoVec> iov,
                                  std::optional<std::string_view> notification) {
    return impl_->write(peer, iov, notification);
}

StatusOr<XferId> Endpoint::readv(PeerId peer, std::span<const IoVec> iov,
                                 std::optional<std::string_view> notification) {
    return impl_->read(peer, iov, notification);
}

Status Endpoint::copy(std::span<const LocalCopy> pieces) { return impl_->copy(pieces); }

Status Endpoint::notify(PeerId peer, std::string_view payload) {
    return impl_->notify(peer, payload);
}
std::vector<Notification> Endpoint::get_notifications() { return impl_->get_notifications(); }

StatusOr<XferId> Endpoint::send(PeerId peer, MemId mem, uint64_t offset, uint64_t len,
                                uint64_t tag) {
    return impl_->send(peer, mem, offset, len, tag);
}

StatusOr<XferId> Endpoint::recv(PeerId peer, MemId mem, uint64_t offset, uint64_t len,
                                uint64_t tag) {
    return impl_->recv(peer, mem, offset, len, tag);
}

TcpxSession Endpoint::session(PeerId peer) { return TcpxSession(this, peer); }

XferStatus Endpoint::poll(XferId xfer) { return impl_->poll(xfer); }
Status Endpoint::wait(XferId xfer, std::chrono::milliseconds timeout) {
    return impl_->wait(xfer, timeout);
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
