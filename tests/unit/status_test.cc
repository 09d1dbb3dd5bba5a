#include "tcpx/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <memory>
#include <string>

#include "common/status_util.h"

namespace tcpx {
namespace {

TEST(Status, OkCarriesNothing) {
    Status st;
    EXPECT_TRUE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kOk);
    EXPECT_EQ(st.message(), "");
    EXPECT_EQ(st.to_string(), "OK");
    EXPECT_TRUE(Status(StatusCode::kOk, "ignored").ok());
}

TEST(Status, ContextReadsOutsideIn) {
    Status st = errno_status(ECONNREFUSED, "connect to 10.0.0.1:5000");
    st.with_context("peer node-7");
    EXPECT_EQ(st.code(), StatusCode::kUnavailable);
    EXPECT_EQ(st.message(), "peer node-7: connect to 10.0.0.1:5000: Connection refused");
    EXPECT_EQ(st.to_string(), "UNAVAILABLE: " + std::string(st.message()));
    EXPECT_TRUE(Status().with_context("nothing").ok());
}

TEST(Status, ErrnoCodes) {
    EXPECT_EQ(errno_status(ECONNRESET, "x").code(), StatusCode::kUnavailable);
    EXPECT_EQ(errno_status(EPIPE, "x").code(), StatusCode::kUnavailable);
    EXPECT_EQ(errno_status(EMFILE, "x").code(), StatusCode::kSystem);
    EXPECT_NE(errno_status(EMFILE, "open").message().find("Too many open files"),
              std::string::npos);
}

TEST(Status, CopyIsDeep) {
    Status a(StatusCode::kInternal, "a");
    Status b = a;
    b.with_context("b");
    EXPECT_EQ(a.message(), "a");
    EXPECT_EQ(b.message(), "b: a");
    EXPECT_FALSE(a == b);
    Status c = a;
    EXPECT_TRUE(a == c);
}

TEST(StatusOr, ValueOrError) {
    StatusOr<std::string> v(std::string("hello"));
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(*v, "hello");
    EXPECT_EQ(v->size(), 5u);
    StatusOr<std::string> e(not_found("no such thing"));
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
    StatusOr<int> bad{Status()};  // an OK status is no value: reported as a bug
    EXPECT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
}

TEST(StatusOr, MoveOnlyValues) {
    StatusOr<std::unique_ptr<int>> p(std::make_unique<int>(7));
    ASSERT_TRUE(p.ok());
    std::unique_ptr<int> taken = std::move(p).value();
    EXPECT_EQ(*taken, 7);
    StatusOr<std::unique_ptr<int>> q = std::move(p);
    EXPECT_TRUE(q.ok());
}

Status fails_second(int* steps) {
    auto first = [&]() -> Status {
        ++*steps;
        return Status();
    };
    auto second = [&]() -> StatusOr<int> {
        ++*steps;
        return out_of_range("too far");
    };
    TCPX_RETURN_IF_ERROR(first());
    TCPX_ASSIGN_OR_RETURN(int v, second());
    *steps += v;
    return Status();
}

TEST(StatusMacros, PropagateTheFirstError) {
    int steps = 0;
    Status st = fails_second(&steps);
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
    EXPECT_EQ(steps, 2);
}

TEST(StatusCodeName, AllNamed) {
    for (int c = 0; c <= static_cast<int>(StatusCode::kUnauthenticated); ++c) {
        EXPECT_STRNE(status_code_name(static_cast<StatusCode>(c)), "UNKNOWN") << c;
    }
    EXPECT_STREQ(status_code_name(static_cast<StatusCode>(999)), "UNKNOWN");
}

}  // namespace
}  // namespace tcpx
