"""The pinned llama.cpp: manifest, verified fetch, patch stack and cached build."""
