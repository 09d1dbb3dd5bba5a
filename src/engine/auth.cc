#include "engine/auth.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdint>

#include "common/status_util.h"

namespace tcpx::engine::auth {

namespace {

constexpr std::string_view kLabel = "tcpx-p2p auth v1";
constexpr std::string_view kSessionLabel = "tcpx-p2p session v1";
constexpr std::string_view kHelloLabel = "tcpx-p2p hello v1";

void put(std::string* out, std::string_view field) {
    const uint32_t n = static_cast<uint32_t>(field.size());
    out->append(reinterpret_cast<const char*>(&n), sizeof(n));
    out->append(field);
}

std::string_view role_name(Role role) { return role == Role::kListener ? "listener" : "connector"; }

// HMAC-SHA-256 of `data` under `key`. HMAC() only fails on allocation failure; it leaves the zero
// MAC, which equal() never accepts: a peer that sends 32 zero bytes must not pass because our
// HMAC failed.
Bytes hmac(std::string_view key, std::string_view data) {
    Bytes out{};
    unsigned int len = 0;
    if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(),
             &len) == nullptr ||
        len != kBytes) {
        out.fill(0);
        ERR_clear_error();
    }
    return out;
}

std::string_view view(const Bytes& b) {
    return std::string_view(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace

StatusOr<Bytes> make_nonce() {
    Bytes n{};
    if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
        return internal_error("RAND_bytes failed: no random nonce for authentication");
    }
    return n;
}

Bytes mac(std::string_view secret, Role role, std::string_view nonce_c, std::string_view nonce_l,
          std::string_view name_c, std::string_view name_l) {
    std::string transcript;
    put(&transcript, kLabel);
    put(&transcript, role_name(role));
    put(&transcript, nonce_c);
    put(&transcript, nonce_l);
    put(&transcript, name_c);
    put(&transcript, name_l);
    return hmac(secret, transcript);
}

Bytes session_key(std::string_view secret, std::string_view nonce_c, std::string_view nonce_l,
                  std::string_view name_c, std::string_view name_l) {
    std::string transcript;
    put(&transcript, kSessionLabel);
    put(&transcript, nonce_c);
    put(&transcript, nonce_l);
    put(&transcript, name_c);
    put(&transcript, name_l);
    return hmac(secret, transcript);
}

Bytes hello_mac(const Bytes& session_key, Role role, std::string_view body) {
    // A zero key is what session_key() leaves when HMAC failed: it is public, so a MAC under it
    // proves nothing. The zero MAC makes equal() fail closed (a forged HELLO is refused).
    static constexpr Bytes kZero{};
    if (CRYPTO_memcmp(session_key.data(), kZero.data(), kBytes) == 0) return Bytes{};
    std::string data;
    put(&data, kHelloLabel);
    put(&data, role_name(role));
    put(&data, body);
    return hmac(view(session_key), data);
}

bool equal(std::string_view received, const Bytes& expected) {
    // Fails closed: the zero MAC is what mac() leaves when HMAC failed (a real HMAC-SHA256 is all
    // zeros with probability 2^-256).
    static constexpr Bytes kZero{};
    if (CRYPTO_memcmp(expected.data(), kZero.data(), kBytes) == 0) return false;
    return received.size() == kBytes &&
           CRYPTO_memcmp(received.data(), expected.data(), kBytes) == 0;
}

Secrets::Secrets(std::string primary, std::string previous) {
    if (!primary.empty()) secrets_.push_back(std::move(primary));
    if (!previous.empty() && !secrets_.empty() && previous != secrets_.front()) {
        secrets_.push_back(std::move(previous));
    }
}

std::vector<Bytes> ListenerCheck::challenge_macs(const Secrets& secrets, std::string_view nonce_c,
                                                 std::string_view nonce_l, std::string_view name_c,
                                                 std::string_view name_l) {
    std::vector<Bytes> out;
    for (const std::string& s : secrets.all()) {
        out.push_back(mac(s, Role::kListener, nonce_c, nonce_l, name_c, name_l));
    }
    return out;
}

std::optional<std::string> ListenerCheck::proof_match(
    const Secrets& secrets, std::string_view proof, std::string_view nonce_c,
    std::string_view nonce_l, std::string_view name_c, std::string_view name_l) {
    std::optional<std::string> found;
    // Every secret is tried, whatever matched first: the time taken does not say which.
    for (const std::string& s : secrets.all()) {
        if (equal(proof, mac(s, Role::kConnector, nonce_c, nonce_l, name_c, name_l)) && !found) {
            found = s;
        }
    }
    return found;
}

std::optional<std::string> connector_match(const Secrets& secrets,
                                           const std::vector<std::string_view>& listener_macs,
                                           std::string_view nonce_c, std::string_view nonce_l,
                                           std::string_view name_c, std::string_view name_l) {
    std::optional<std::string> found;
    for (const std::string& s : secrets.all()) {
        const Bytes expected = mac(s, Role::kListener, nonce_c, nonce_l, name_c, name_l);
        for (std::string_view m : listener_macs) {
            if (equal(m, expected) && !found) found = s;
        }
    }
    return found;
}

}  // namespace tcpx::engine::auth
