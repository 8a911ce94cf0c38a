"""File plumbing under every output: atomic writes, large files written around the page cache,
all outputs of a command committed together, termination signals turned into a clean exit,
protobuf wire encoding, the outputs' names and their errors."""
