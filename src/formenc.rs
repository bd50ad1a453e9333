//! Form encoding of store keys (stub, being written).
