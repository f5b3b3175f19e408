"""zs_mpi_test: one GoogleTest binary run under mpirun at several world sizes."""

load("//runtime:defs.bzl", "CXX_OPTS")

def zs_mpi_test(name, srcs, deps = [], ranks = [1, 2, 3, 4], size = "medium", tags = [], env = {}, data = [], copts = [], mpi_host_collectives = False, **kwargs):
    """Builds NAME_bin and one sh_test NAME_npN per world size N.

    Each NAME_npN runs `mpirun -np N NAME_bin` (tests/testing/run_mpi.sh)
    with `env` set and `data` (also the binary's) in its runfiles.
    They are tagged "exclusive" so that Bazel never runs two multi-rank tests
    at once on a small machine, and "mpi" for filtering.

    The contexts' host collectives are the default (AUTO: the shared-memory
    segment, all ranks being on this host). mpi_host_collectives adds
    NAME_mpi_npN for every N above 1, the same runs with MPI's collectives
    (ZS_HOST_COLLECTIVES=mpi), tagged zs_long (tools/zs test --long), and
    the suite NAME_mpi.
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
    if not mpi_host_collectives:
        return
    mpi_tests = []
    mpi_env = dict(env)
    mpi_env["ZS_HOST_COLLECTIVES"] = "mpi"
    for n in ranks:
        if n == 1:
            continue
        test_name = "%s_mpi_np%d" % (name, n)
        native.sh_test(
            name = test_name,
            size = size,
            srcs = ["//tests/testing:run_mpi.sh"],
            args = [str(n), "$(location :%s_bin)" % name],
            data = [":" + name + "_bin"] + data,
            tags = tags + ["mpi", "exclusive", "zs_long"],
            env = mpi_env,
        )
        mpi_tests.append(":" + test_name)
    native.test_suite(name = name + "_mpi", tests = mpi_tests, tags = tags + ["zs_long"])
