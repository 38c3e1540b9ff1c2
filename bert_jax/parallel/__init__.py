"""Devices and processes at run time: the mesh and its shardings, multi-process start-up
and its roster, the one-run-per-workdir lock (a local flock, or a lease on a bucket), and
the host allocator the commands exec with."""
