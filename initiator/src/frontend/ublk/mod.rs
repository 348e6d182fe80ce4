//! ublk
