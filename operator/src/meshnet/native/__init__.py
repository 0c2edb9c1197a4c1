"""Native builds of our own C++ (the shard worker and its tools) and where they land."""
