// A Net that wraps another and breaks it on purpose: calls fail, comms reset, messages vanish,
// arrive late, short or corrupted, by rules given as text (TCPX_P2P_FAULT). It is part of the
// shipped library, not of test builds, so what the fault tests exercise is what ships; with no
// rules configured nothing wraps the transport at all.
//
// Grammar (docs/fault-injection.md has the details and examples): comma-separated rules
//
//   KIND:OP:N[:ARG][@commK]
//
//   KIND  fail | reset | drop | delay | truncate | corrupt
//   OP    listen | connect | accept | reg_mr | isend | irecv | test | irecv_consumed | close
//   N     the Nth counted call of OP (from 1), per FaultNet instance, or per comm with @commK
//   ARG   delay: a duration (250ms, 2s, 500us); truncate: the byte count reported or sent
//         (default: half); corrupt: how many bytes to flip (default 1). No other kind takes one.
//   @commK  only calls on the Kth comm that connect()/accept() produced (from 1).
//
// What counts as a call of OP: polled calls count only when they achieve something, so a rule
// names the same event on every run: connect/accept count the comms they return, isend/irecv the
// requests they post (a "no room" answer is not counted), test the completions it reports. The
// other ops count every call.
#pragma once

#include <memory>
#include <string_view>

#include "net/net.h"
#include "tcpx/status.h"

namespace tcpx::net {

// `inner` wrapped by the rules of `spec`. INVALID_ARGUMENT naming the rule when `spec` does not
// parse. An empty spec is valid and injects nothing.
StatusOr<std::unique_ptr<Net>> make_fault_net(std::unique_ptr<Net> inner, std::string_view spec);

}  // namespace tcpx::net
