// test-layer-range.cpp - layer ranges and splits are parsed strictly, and a split is accepted
// only when its ranges are valid and cover the model's layers contiguously.
#include "layer_range.h"
#include "service_test.h"

using namespace meshnet;

static std::vector<layer_range> split_of(const char * text) {
    std::vector<layer_range> split;
    std::string error;
    CHECK(layer_split_parse(text, split, error));
    return split;
}

static bool mentions(const std::string & text, const char * part) {
    return text.find(part) != std::string::npos;
}

TEST("a range is parsed from BEGIN:END") {
    layer_range range;
    std::string error;
    CHECK(layer_range_parse("7:22", range, error));
    CHECK_EQ(range.begin, 7);
    CHECK_EQ(range.end, 22);
    CHECK_EQ(range.str(), std::string("7:22"));
}

TEST("malformed ranges are refused with the text that was given") {
    layer_range range;
    std::string error;
    for (const char * text : {"", ":", "7", "7:", ":22", "a:b", "-1:3", "1:2:3", "1 :2", "0x1:2", "1234567890:2"}) {
        CHECK(!layer_range_parse(text, range, error));
        CHECK(mentions(error, text));
    }
}

TEST("an open end is taken only where asked for, and printed as it was given") {
    layer_range range;
    std::string error;
    CHECK(!layer_range_parse("7:", range, error));
    CHECK(layer_range_parse("7:", range, error, /*open_end=*/true));
    CHECK_EQ(range.begin, 7);
    CHECK_EQ(range.end, layer_range::to_n_layer);
    CHECK_EQ(range.str(), std::string("7:"));
    CHECK(layer_range_parse("7:22", range, error, /*open_end=*/true));
    CHECK_EQ(range.str(), std::string("7:22"));
    for (const char * text : {":", ":22", "a:", "-1:", "7"}) {
        CHECK(!layer_range_parse(text, range, error, /*open_end=*/true));
        CHECK(mentions(error, text));
    }
}

TEST("a split is a comma-separated list of ranges") {
    const std::vector<layer_range> split = split_of("0:10,10:20,20:30");
    CHECK_EQ(split.size(), size_t(3));
    CHECK_EQ(split[1].begin, 10);
    CHECK_EQ(layer_split_str(split), std::string("0:10,10:20,20:30"));
    std::string error;
    std::vector<layer_range> bad;
    CHECK(!layer_split_parse("0:10,,10:30", bad, error));
    CHECK(!layer_split_parse("0:10;10:30", bad, error));
}

TEST("empty, reversed and out-of-range ranges are refused") {
    CHECK(mentions(layer_range_check({5, 5}, 30), "empty"));
    CHECK(mentions(layer_range_check({9, 3}, 30), "reversed"));
    CHECK(mentions(layer_range_check({25, 31}, 30), "outside"));
    CHECK(mentions(layer_range_check({-1, 3}, 30), "outside"));
    CHECK(layer_range_check({0, 30}, 30).empty());
    CHECK(layer_range_check({29, 30}, 30).empty());
}

TEST("a split must cover the model contiguously") {
    CHECK(layer_split_check(split_of("0:15,15:30"), 30).empty());
    CHECK(layer_split_check(split_of("0:1,1:29,29:30"), 30).empty());
    CHECK(layer_split_check(split_of("0:30"), 30).empty());
    CHECK(mentions(layer_split_check(split_of("0:10,12:30"), 30), "layers 10:12 are missing"));
    CHECK(mentions(layer_split_check(split_of("0:16,15:30"), 30), "layers 15:16 overlap"));
    CHECK(mentions(layer_split_check(split_of("0:15"), 30), "missing at the end"));
    CHECK(mentions(layer_split_check(split_of("1:30"), 30), "layers 0:1 are missing"));
    CHECK(mentions(layer_split_check(split_of("15:30,0:15"), 30), "contiguously"));
    CHECK(mentions(layer_split_check(split_of("0:15,15:15,15:30"), 30), "empty"));
    CHECK(mentions(layer_split_check({}, 30), "at least one"));
}

int main(int argc, char ** argv) {
    return meshnet_test::run_all(argc, argv);
}
