"""Generated protobuf modules (do not edit; regenerate with scripts/gen_proto.sh)."""
