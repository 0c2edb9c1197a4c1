// cuda_lane.h - what a CUDA build of the worker needs before it starts: an NVIDIA driver
// new enough for the CUDA runtime it was built with, and a CUDA device.
#pragma once

#include <string>

namespace meshnet {

// Empty on every other lane and where the driver and a device are there; otherwise why
// this CUDA build cannot serve here (no driver, a driver too old, no device visible).
// Loads the backends (backends_init) to count the devices.
std::string cuda_lane_refusal();

} // namespace meshnet
