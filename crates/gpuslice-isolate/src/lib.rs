//! isolation (to be written)
