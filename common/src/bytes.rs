//! Little-endian field access on byte slices, as every NVMe structure uses.
//!
//! Callers pass slices that they have already checked to be long enough; an
//! out-of-range offset is a programming error and panics like any slice index.

/// Reads a `u16` at `off`.
pub fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Reads a `u32` at `off`.
pub fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

/// Reads a `u64` at `off`.
pub fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// Writes a `u16` at `off`.
pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// Writes a `u32` at `off`.
pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Writes a `u64` at `off`.
pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Copies `s` into the fixed-width field `b[off..off + width]`, padded with `pad`
/// (space for ASCII identifiers, NUL for NQNs), truncated if too long.
pub fn put_str(b: &mut [u8], off: usize, width: usize, s: &str, pad: u8) {
    let field = &mut b[off..off + width];
    field.fill(pad);
    let n = s.len().min(width);
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// An NQN field: the bytes up to the first NUL, exactly (no trimming; bytes
/// that are not UTF-8 become U+FFFD, which no configured NQN contains).
pub fn get_nqn(b: &[u8], off: usize, width: usize) -> String {
    let field = &b[off..off + width];
    let end = field.iter().position(|&c| c == 0).unwrap_or(width);
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Reads a NUL- or space-terminated string field, lossily decoded.
pub fn get_str(b: &[u8], off: usize, width: usize) -> String {
    let field = &b[off..off + width];
    let end = field.iter().position(|&c| c == 0).unwrap_or(width);
    String::from_utf8_lossy(&field[..end])
        .trim_end()
        .to_string()
}
