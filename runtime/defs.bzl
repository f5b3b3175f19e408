"""What every layer's BUILD shares: the C compiler options and the
filegroup of its sources that the layer checks read (//tests/layers)."""

C_OPTS = ["-Wshadow", "-Wstrict-prototypes", "-Wmissing-prototypes"]

def layer_sources(name = "sources"):
    """The package's C, CUDA and header files, for //tests/layers."""
    native.filegroup(
        name = name,
        srcs = native.glob(["*.c", "*.cu", "*.h"]),
        visibility = ["//tests/layers:__pkg__"],
    )
