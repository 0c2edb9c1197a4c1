// service_test.h - the few helpers the service's unit tests share: named test cases
// that read as sentences, CHECK that reports file:line, and a main that runs them.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace meshnet_test {

struct test_case {
    const char *          name;
    std::function<void()> body;
};

inline std::vector<test_case> & registry() {
    static std::vector<test_case> cases;
    return cases;
}

inline int & failures() {
    static int count = 0;
    return count;
}

struct registrar {
    registrar(const char * name, std::function<void()> body) { registry().push_back({name, std::move(body)}); }
};

inline int run_all(int argc, char ** argv) {
    const std::string only = argc > 1 ? argv[1] : "";
    int passed = 0, failed = 0;
    for (const auto & test : registry()) {
        if (!only.empty() && std::string(test.name).find(only) == std::string::npos) continue;
        const int before = failures();
        test.body();
        const bool ok = failures() == before;
        std::printf("%s %s\n", ok ? "PASS" : "FAIL", test.name);
        std::fflush(stdout);
        (ok ? passed : failed)++;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}

} // namespace meshnet_test

#define MESHNET_CONCAT2(a, b) a##b
#define MESHNET_CONCAT(a, b) MESHNET_CONCAT2(a, b)
#define TEST(name) \
    static void MESHNET_CONCAT(test_fn_, __LINE__)(); \
    static meshnet_test::registrar MESHNET_CONCAT(test_reg_, __LINE__)(name, MESHNET_CONCAT(test_fn_, __LINE__)); \
    static void MESHNET_CONCAT(test_fn_, __LINE__)()

#define CHECK(cond) do { if (!(cond)) { \
    std::printf("  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); meshnet_test::failures()++; } } while (0)

#define CHECK_EQ(a, b) do { const auto & va_ = (a); const auto & vb_ = (b); if (!(va_ == vb_)) { \
    std::printf("  %s:%d: CHECK_EQ(%s, %s) failed\n", __FILE__, __LINE__, #a, #b); meshnet_test::failures()++; } } while (0)

#define TEST_MAIN() int main(int argc, char ** argv) { return meshnet_test::run_all(argc, argv); }
