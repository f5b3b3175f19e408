"""What every layer's BUILD shares: the C compiler options and the
filegroup of its sources that the layer checks read (//tests/layers)."""

# Per target, not in .bazelrc: a program built in this workspace (or one
# that takes ZeroShard as an external repository) keeps its own standard
# and warnings (docs/install.md).
# Every C program and test of the tree: C11 and warnings.
C_PROGRAM_OPTS = ["-std=c11", "-Wall", "-Wextra"]

# Every C++ test: C++17 (GoogleTest's minimum is 14) and warnings.
CXX_OPTS = ["-std=c++17", "-Wall", "-Wextra"]

# The library's C sources: also stricter warnings, and hidden symbols
# (the public headers' declarations are default, so libzeroshard exports
# the public API only).
C_LIB_OPTS = C_PROGRAM_OPTS + ["-fvisibility=hidden"]

C_OPTS = C_LIB_OPTS + ["-Wshadow", "-Wstrict-prototypes", "-Wmissing-prototypes"]

# The GPUs every .cu file is compiled for (docs/cuda.md, "Architectures"):
# SASS for each of these compute capabilities (A100 sm_80, RTX 30xx/A40
# sm_86, L40S/RTX 40xx sm_89, H100/H200 sm_90, B200 sm_100, RTX 50xx
# sm_120; CUDA 13's nvcc accepts sm_75 and newer), and PTX for the newest,
# which the driver compiles for later GPUs. No kernel uses anything
# Hopper-only, so every architecture runs the same code.
CUDA_ARCHS = ["80", "86", "89", "90", "100", "120"]

NVCC_GENCODE = " ".join(
    ["-gencode arch=compute_%s,code=sm_%s" % (a, a) for a in CUDA_ARCHS] +
    ["-gencode arch=compute_%s,code=compute_%s" % (CUDA_ARCHS[-1], CUDA_ARCHS[-1])],
) + " "

# The same, as zs env prints it.
CUDA_ARCHS_TEXT = " ".join(["sm_" + a for a in CUDA_ARCHS]) + " (SASS), compute_" + CUDA_ARCHS[-1] + " (PTX)"

def layer_sources(name = "sources"):
    """The package's C, CUDA and header files, for //tests/layers."""
    native.filegroup(
        name = name,
        srcs = native.glob(["*.c", "*.cu", "*.h"]),
        visibility = [
            "//tests/install:__pkg__",
            "//tests/layers:__pkg__",
        ],
    )

def _archives(dep, flags, own_only):
    """The static archives and loose objects a dependency links (its own
    and, unless own_only, its dependencies'), PIC where there is a PIC
    build; appends the link flags they ask for (system libraries) to
    flags."""
    files = []
    for li in dep[CcInfo].linking_context.linker_inputs.to_list():
        if own_only and li.owner != dep.label:
            continue
        for fl in li.user_link_flags:
            if fl not in flags:
                flags.append(fl)
        for lib in li.libraries:
            a = lib.pic_static_library or lib.static_library
            if a != None:
                files.append(a)
            else:
                files.extend(lib.pic_objects or lib.objects or [])
    return files

def _zs_library_impl(ctx):
    inputs, flags = [], []
    for d in ctx.attr.deps:
        for f in _archives(d, flags, ctx.attr.own_only):
            if f not in inputs:
                inputs.append(f)
    obj = ctx.actions.declare_file(ctx.attr.lib + ".o")
    static = ctx.outputs.static
    shared = ctx.outputs.shared
    args = [
        obj.path,
        static.path,
        shared.path,
        ctx.attr.soname,
        ctx.file.version_script.path,
        " ".join(flags + ctx.attr.link_flags),
        " ".join(["--keep-global-symbol=" + s for s in ctx.attr.keep_global]),
        "" if ctx.attr.allow_undefined else "-Wl,--no-undefined -Wl,-z,defs",
    ] + [f.path for f in inputs]
    ctx.actions.run_shell(
        inputs = inputs + [ctx.file.version_script],
        outputs = [obj, static, shared],
        arguments = args,
        mnemonic = "ZsLibrary",
        use_default_shell_env = True,  # PATH for gcc, ld, objcopy, ar
        progress_message = "Linking %s and %s" % (static.short_path, shared.short_path),
        # One relocatable object of every member (ld -r), its hidden
        # symbols made local (so the static library shows only the public
        # API, and internal names cannot clash with a user's), then the
        # archive and the shared library from it (-lstdc++: nvcc's host
        # code is C++).
        command = """set -e
obj=$1 static=$2 shared=$3 soname=$4 map=$5 libs=$6 keep=$7 defs=$8; shift 8
ld -r -o "$obj" --whole-archive "$@" --no-whole-archive
objcopy --localize-hidden $keep "$obj"
rm -f "$static"; ar rcD "$static" "$obj"
gcc -shared -o "$shared" -Wl,-soname,"$soname" -Wl,--version-script="$map" \
  $defs -Wl,--as-needed "$obj" $libs -lstdc++
""",
    )
    return [DefaultInfo(
        files = depset([static, shared]),
        runfiles = ctx.runfiles(files = [static, shared]),
    )]

zs_library = rule(
    implementation = _zs_library_impl,
    doc = """The installable library: libLIB.a and libLIB.so.MAJOR from the
    deps' objects (docs/install.md). Internal symbols are hidden in both
    (the sources are compiled with -fvisibility=hidden; the public
    headers' declarations are default): the shared library exports what
    version_script lists, the static one has those as its only globals.""",
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "lib": attr.string(mandatory = True),
        "soname": attr.string(mandatory = True),
        "version_script": attr.label(allow_single_file = True, mandatory = True),
        "static": attr.output(mandatory = True),
        "shared": attr.output(mandatory = True),
        "own_only": attr.bool(doc = "only the deps' own objects, not their dependencies' (a plugin over the library)"),
        "keep_global": attr.string_list(doc = "if given, the only global symbols kept (objcopy --keep-global-symbol)"),
        "allow_undefined": attr.bool(doc = "the shared library may leave symbols for the loading program"),
        "link_flags": attr.string_list(doc = "more flags for the shared library's link"),
    },
)
