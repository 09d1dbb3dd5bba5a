// Peer authentication: a mutual HMAC-SHA-256 challenge-response over the control connection,
// before any other message is read and before any transport resource is made for the peer.
//
//   connector -> listener  AUTH_INIT       nonce_c, name_c
//   listener  -> connector AUTH_CHALLENGE  nonce_l, name_l, MAC(k, "listener"  | transcript)
//                                          for each secret k the listener holds
//   connector -> listener  AUTH_PROOF      MAC(k, "connector" | transcript)
//   both ways              HELLO           ..., MAC(s, role | the HELLO's other bytes)
//
// transcript = protocol label, nonce_c, nonce_l, name_c, name_l (each length-prefixed), so a MAC
// binds both fresh nonces and both endpoint identities; the role label keeps a MAC of one
// direction from being replayed in the other (reflection). The connector checks the listener's
// MAC before it sends anything else (its HELLO carries its handles), and proves itself with the
// secret that matched; the listener checks that proof before it reads a HELLO. Each side's HELLO
// (its data-channel handles, channel count, chunk size) then carries a MAC under the connection's
// session key s, derived from the secret and the transcript: what the handshake authenticated is
// also what sets the connection up, so no one on the path can change where we connect our data
// channels to or what we take from the peer's HELLO. A listener holds
// one or two secrets (AUTH_SECRET, AUTH_SECRET_PREVIOUS while rotating), so endpoints on the old
// and the new secret keep talking during a rotation (docs/security.md).
//
// libcrypto does the cryptography: HMAC-SHA-256, RAND_bytes for nonces, CRYPTO_memcmp to compare
// in constant time.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tcpx/status.h"

namespace tcpx::engine::auth {

inline constexpr size_t kBytes = 32;  // nonce and MAC
using Bytes = std::array<unsigned char, kBytes>;

enum class Role { kListener, kConnector };

// A fresh random nonce.
StatusOr<Bytes> make_nonce();

// The MAC `role` sends, under `secret`, for the exchange between connector `name_c` and
// listener `name_l` with their nonces.
Bytes mac(std::string_view secret, Role role, std::string_view nonce_c, std::string_view nonce_l,
          std::string_view name_c, std::string_view name_l);

// Constant-time comparison of a received MAC with an expected one (false on any length but
// kBytes, and always false for the zero MAC, which mac() leaves when HMAC fails).
bool equal(std::string_view received, const Bytes& expected);

// The secrets an endpoint holds, primary first; empty when it authenticates no one.
class Secrets {
 public:
    Secrets() = default;
    Secrets(std::string primary, std::string previous);
    bool enabled() const { return !secrets_.empty(); }
    const std::vector<std::string>& all() const { return secrets_; }

 private:
    std::vector<std::string> secrets_;
};

// The listener's side of one exchange.
struct ListenerCheck {
    // The listener's MACs, one per secret, for AUTH_CHALLENGE.
    static std::vector<Bytes> challenge_macs(const Secrets& secrets, std::string_view nonce_c,
                                             std::string_view nonce_l, std::string_view name_c,
                                             std::string_view name_l);
    // The listener's secret the connector's proof is valid under, or none.
    static std::optional<std::string> proof_match(const Secrets& secrets, std::string_view proof,
                                                  std::string_view nonce_c,
                                                  std::string_view nonce_l, std::string_view name_c,
                                                  std::string_view name_l);
};

// The connector's side: the secret of ours that one of the listener's MACs proves it knows, or
// none (then the listener is not to be trusted with anything).
std::optional<std::string> connector_match(const Secrets& secrets,
                                           const std::vector<std::string_view>& listener_macs,
                                           std::string_view nonce_c, std::string_view nonce_l,
                                           std::string_view name_c, std::string_view name_l);

// Once both sides have proved `secret`: the connection's own key, from the secret and the
// exchange's transcript (both nonces, both names).
Bytes session_key(std::string_view secret, std::string_view nonce_c, std::string_view nonce_l,
                  std::string_view name_c, std::string_view name_l);

// The MAC `role` puts on its HELLO, whose other bytes are `body`, under the session key.
Bytes hello_mac(const Bytes& session_key, Role role, std::string_view body);

}  // namespace tcpx::engine::auth
