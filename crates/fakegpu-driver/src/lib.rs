//! fake driver (to be written)
