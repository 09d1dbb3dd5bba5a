// The check that Google's receive-datapath manager (RxDM) is there before Google's TCPX plugin
// is used (it would exit the process in accept() otherwise), on a directory of the test's own.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/socket.h"
#include "net/plugin/plugin_loader.h"

namespace tcpx::net {
namespace {

class RxdmCheck : public ::testing::Test {
 protected:
    void SetUp() override {
        char dir[] = "/tmp/tcpx-rxdm-XXXXXX";
        ASSERT_NE(::mkdtemp(dir), nullptr);
        dir_ = dir;
    }
    void TearDown() override {
        ::unlink((dir_ + "/rx_rule_manager").c_str());
        ::rmdir(dir_.c_str());
    }
    std::string dir_;
};

TEST_F(RxdmCheck, OnlyTheRealPluginIsChecked) {
    EXPECT_TRUE(check_rxdm_running("GPUDirectTCPX_v7_emulated", dir_.c_str()).ok());
    EXPECT_TRUE(check_rxdm_running("tcpx-p2p-socket", dir_.c_str()).ok());
    EXPECT_TRUE(check_rxdm_running(nullptr, dir_.c_str()).ok());
}

TEST_F(RxdmCheck, NoSocketIsAClearError) {
    Status st = check_rxdm_running("GPUDirectTCPX_v7", dir_.c_str());
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    const std::string msg = st.to_string();
    EXPECT_NE(msg.find("RxDM) is not running"), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir_ + "/rx_rule_manager does not exist"), std::string::npos) << msg;
    EXPECT_NE(msg.find("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--uds_path " + dir_), std::string::npos) << msg;
}

TEST_F(RxdmCheck, AFileIsNotTheSocket) {
    FILE* f = std::fopen((dir_ + "/rx_rule_manager").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
    Status st = check_rxdm_running("GPUDirectTCPX_v7", dir_.c_str());
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.to_string().find("is not a UNIX socket"), std::string::npos) << st.to_string();
}

TEST_F(RxdmCheck, TheSocketIsEnough) {
    Fd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
    ASSERT_TRUE(fd.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = dir_ + "/rx_rule_manager";
    ASSERT_LT(path.size(), sizeof(addr.sun_path));
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    ASSERT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_TRUE(check_rxdm_running("GPUDirectTCPX_v7", dir_.c_str()).ok());
}

TEST_F(RxdmCheck, TheDefaultPrefixIsTmp) {
    if (::access("/tmp/rx_rule_manager", F_OK) == 0) GTEST_SKIP() << "an RxDM runs here";
    for (const char* prefix : {static_cast<const char*>(nullptr), ""}) {
        Status st = check_rxdm_running("GPUDirectTCPX_v7", prefix);
        ASSERT_FALSE(st.ok());
        EXPECT_NE(st.to_string().find("/tmp/rx_rule_manager does not exist"), std::string::npos)
            << st.to_string();
    }
}

}  // namespace
}  // namespace tcpx::net
