//! Discovery (filled in below).
