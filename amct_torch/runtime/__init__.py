"""The process's own plumbing: helper threads, thread and allocator settings, job progress and
the package's names imported on first use."""
