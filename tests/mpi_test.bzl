"""zs_mpi_test: one GoogleTest binary run under mpirun at several world sizes."""

load("//runtime:defs.bzl", "CXX_OPTS")

def zs_mpi_test(name, srcs, deps = [], ranks = [1, 2, 3, 4], size = "medium", tags = [], env = {}, data = [], copts = [], **kwargs):
    """Builds NAME_bin and one sh_test NAME_npN per world size N.

    Each NAME_npN runs `mpirun -np N NAME_bin` (tests/testing/run_mpi.sh)
    with `env` set and `data` (also the binary's) in its runfiles.
    They are tagged "exclusive" so that Bazel never runs two multi-rank tests
    at once on a small machine, and "mpi" for filtering.
    """
    native.cc_binary(
        name = name + "_bin",
        testonly = True,
        srcs = srcs,
        copts = CXX_OPTS + copts,
        deps = deps + ["//tests/testing:mpi_main"],
        data = data,
        **kwargs
    )
    tests = []
    for n in ranks:
        test_name = "%s_np%d" % (name, n)
        native.sh_test(
            name = test_name,
            size = size,
            srcs = ["//tests/testing:run_mpi.sh"],
            args = [str(n), "$(location :%s_bin)" % name],
            data = [":" + name + "_bin"] + data,
            tags = tags + ["mpi", "exclusive"],
            env = env,
        )
        tests.append(":" + test_name)
    native.test_suite(name = name, tests = tests, tags = tags)
