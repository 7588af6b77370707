//! fake GPU host (to be written)
