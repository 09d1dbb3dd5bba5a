"""Two NIXL agents move 64 MiB of host memory through the TCPX backend: a WRITE with a
notification, then a READ back. Run with NIXL's Python package importable and NIXL_PLUGIN_DIR
naming a directory that holds libplugin_TCPX.so (see docs/nixl.md):

    NIXL_PLUGIN_DIR=build/nixl-plugins python3 plugins/nixl/examples/tcpx_write.py

In a real deployment the two agents live in different processes or machines: exchange
get_agent_metadata() out of band instead of passing it directly.
"""
import sys
import time

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config

N = 64 << 20
# Backend parameters are strings; any TCPX_P2P_* setting is accepted by name too.
params = {"interface": "=lo", "channels": "2", "nsocks": "4"}

cfg = nixl_agent_config(backends=[])
prefill = nixl_agent("prefill", cfg)
decode = nixl_agent("decode", cfg)
for agent in (prefill, decode):
    agent.create_backend("TCPX", params)

src = np.random.default_rng(1).integers(0, 256, N, dtype=np.uint8)
dst = np.zeros(N, dtype=np.uint8)
prefill.register_memory([(src.ctypes.data, N, 0, "")], "DRAM")
decode.register_memory([(dst.ctypes.data, N, 0, "")], "DRAM")
prefill.add_remote_agent(decode.get_agent_metadata())
prefill.make_connection("decode")  # else the first transfer opens the connection


def wait(agent, handle):
    t0 = time.time()
    while (state := agent.check_xfer_state(handle)) == "PROC":
        if time.time() - t0 > 30:
            sys.exit("timed out")
    if state != "DONE":
        sys.exit(f"transfer failed: {state}")
    return time.time() - t0


local = prefill.get_xfer_descs([(src.ctypes.data, N, 0)], "DRAM")
remote = decode.get_xfer_descs([(dst.ctypes.data, N, 0)], "DRAM")
handle = prefill.initialize_xfer("WRITE", local, remote, "decode", b"kv-ready")
prefill.transfer(handle)
seconds = wait(prefill, handle)
# The target learns of the write through its notification, sent after the data landed.
while not decode.check_remote_xfer_done("prefill", b"kv-ready"):
    pass
assert (src == dst).all(), "WRITE: data mismatch"
print(f"WRITE {N >> 20} MiB: {N / seconds / 1e9:.2f} GB/s, notification received")
prefill.release_xfer_handle(handle)

src[:] = 0
handle = prefill.initialize_xfer("READ", local, remote, "decode")
prefill.transfer(handle)
seconds = wait(prefill, handle)
assert (src == dst).all(), "READ: data mismatch"
print(f"READ  {N >> 20} MiB: {N / seconds / 1e9:.2f} GB/s")
prefill.release_xfer_handle(handle)
