"""CMake build steps shared by the llama.cpp pin and our worker: a logged step with
progress, the generator and compiler launcher, a bounded build cache."""
