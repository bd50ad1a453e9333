//! Stage 2, export (stub, being written).
