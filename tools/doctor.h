// `tcpx-p2p doctor`: what this machine offers a tcpx-p2p endpoint and what would stop one, as a
// table or JSON. Every problem comes with its one-line fix; the exit code is 1 when something
// would stop a run (an invalid setting, no usable interface, a plugin that does not load, Google's
// plugin without its receive-datapath manager), else 0.
#pragma once

namespace tcpx::tools {

struct DoctorOptions {
    bool json = false;
};

int run_doctor(const DoctorOptions& options);

}  // namespace tcpx::tools
