"""The meta device: one device over several, each tensor split or mirrored across them
(ggml-backend-meta.h)."""
