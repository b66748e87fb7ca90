//! Batches built by token count.
