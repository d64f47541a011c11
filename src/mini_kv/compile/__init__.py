"""Content-addressed compiler: one build directory per hash of sources, flags and toolchain."""
