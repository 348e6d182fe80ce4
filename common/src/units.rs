//! Placeholder until the units module lands.
