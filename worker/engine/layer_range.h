// layer_range.h - layer ranges [begin, end) and splits of a model into contiguous stages:
// parsing ("0:15,15:30") and the checks every loader and tool applies before loading.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshnet {

struct layer_range {
    static constexpr int32_t to_n_layer = -1; // an open end: up to the model's last layer

    int32_t begin = 0;
    int32_t end   = 0;

    int32_t n_layers() const { return end - begin; }
    std::string str() const; // "begin:end" ("begin:" for an open end)
};

// Parses "begin:end" (decimal, no sign); with `open_end`, also "begin:" (end = to_n_layer).
// On failure returns false and sets `error`, which quotes the text.
bool layer_range_parse(const std::string & text, layer_range & out, std::string & error,
                       bool open_end = false);

// Parses a comma-separated list of ranges, e.g. "0:10,10:20,20:30".
bool layer_split_parse(const std::string & text, std::vector<layer_range> & out, std::string & error);

// Empty: the range is a non-empty part of [0, n_layer). Otherwise the reason it is not.
std::string layer_range_check(const layer_range & range, int32_t n_layer);

// Empty: the ranges are valid and cover [0, n_layer) contiguously, in order, without
// gaps or overlaps. Otherwise the first reason they do not.
std::string layer_split_check(const std::vector<layer_range> & split, int32_t n_layer);

std::string layer_split_str(const std::vector<layer_range> & split); // "0:15,15:30"

} // namespace meshnet
