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
    native.test_suite(name = name, tests = _runs(name, "", ranks, size, tags, env, data), tags = tags)
    if mpi_host_collectives:
        mpi_env = dict(env)
        mpi_env["ZS_HOST_COLLECTIVES"] = "mpi"
        mpi_tags = tags + ["zs_long"]
        native.test_suite(
            name = name + "_mpi",
            tests = _runs(name, "_mpi", [n for n in ranks if n > 1], size, mpi_tags, mpi_env, data),
            tags = mpi_tags,
        )

def _runs(name, suffix, ranks, size, tags, env, data):
    """One sh_test NAME{suffix}_npN per world size N; returns their labels."""
    tests = []
    for n in ranks:
        test_name = "%s%s_np%d" % (name, suffix, n)
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
    return tests
