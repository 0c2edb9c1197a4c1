// cpu_backend.h - loading ggml's backends, and which build of its CPU backend computes. A
// portable build ships the CPU backend as one module per CPU generation
// (libggml-cpu-<variant>.so beside the binary) and ggml loads the best one this CPU runs;
// MESHNET_CPU_VARIANT=<variant> loads that one instead (e.g. x64: no AVX at all).
#pragma once

#include <string>

namespace meshnet {

// Loads the backends once per process (later calls return the first result). False, with
// `error`, when MESHNET_CPU_VARIANT names a module that is missing or that this CPU cannot
// run, or when it is set for a build whose CPU backend is compiled in (a native build).
bool backends_init(std::string & error);

// The CPU backend that computes: the instruction sets it was compiled with ("x64" when
// none beyond the x86-64 baseline), and the variant when MESHNET_CPU_VARIANT forced one.
// Call after backends_init.
std::string cpu_backend_describe();

} // namespace meshnet
