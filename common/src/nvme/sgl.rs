//! SGL descriptors as NVMe over Fabrics uses them in the command's data pointer.

use crate::bytes::{get_u32, get_u64, put_u32, put_u64};

/// The SGL descriptors a Fabrics command can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sgl {
    /// Data Block, Offset subtype (0h/1h): data is in the command capsule at
    /// `offset` from the start of the in-capsule data area.
    InCapsule { offset: u64, len: u32 },
    /// Transport SGL Data Block (5h/Ah): data moves by the transport's own
    /// means (NVMe/TCP R2T/H2CData and C2HData).
    Transport { len: u32 },
    /// Keyed SGL Data Block (4h): a remote memory region for RDMA READ/WRITE.
    /// `invalidate` asks for SEND_WITH_INVALIDATE of `key` (subtype Fh).
    Keyed {
        addr: u64,
        len: u32,
        key: u32,
        invalidate: bool,
    },
    /// A Data Block descriptor with the address subtype and no data (len 0),
    /// as hosts send for commands that move no data.
    Null,
    /// Any other descriptor identifier; [`Sgl::check`] rejects it.
    Unsupported(u8),
}

/// Why an SGL descriptor was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SglError {
    /// The descriptor type/subtype is not one this transport understands.
    #[error("unsupported SGL descriptor type {0:#04x}")]
    UnsupportedType(u8),
}

const TYPE_DATA_BLOCK: u8 = 0x0;
const TYPE_KEYED: u8 = 0x4;
const TYPE_TRANSPORT: u8 = 0x5;
const SUBTYPE_ADDRESS: u8 = 0x0;
const SUBTYPE_OFFSET: u8 = 0x1;
const SUBTYPE_TRANSPORT_SPECIFIC: u8 = 0xa;
const SUBTYPE_INVALIDATE_KEY: u8 = 0xf;

impl Sgl {
    /// Decodes the 16-byte descriptor. Unknown kinds are returned as errors
    /// by [`Sgl::check`]; parsing itself never fails.
    pub fn from_bytes(b: &[u8]) -> Self {
        let id = b[15];
        let (ty, sub) = (id >> 4, id & 0xf);
        match (ty, sub) {
            (TYPE_DATA_BLOCK, SUBTYPE_OFFSET) => Sgl::InCapsule {
                offset: get_u64(b, 0),
                len: get_u32(b, 8),
            },
            (TYPE_TRANSPORT, SUBTYPE_TRANSPORT_SPECIFIC) => Sgl::Transport { len: get_u32(b, 8) },
            (TYPE_KEYED, SUBTYPE_ADDRESS | SUBTYPE_INVALIDATE_KEY) => Sgl::Keyed {
                addr: get_u64(b, 0),
                len: u32::from_le_bytes([b[8], b[9], b[10], 0]),
                key: get_u32(b, 11),
                invalidate: sub == SUBTYPE_INVALIDATE_KEY,
            },
            (TYPE_DATA_BLOCK, SUBTYPE_ADDRESS) if get_u32(b, 8) == 0 => Sgl::Null,
            _ => Sgl::Unsupported(id),
        }
    }

    /// Encodes the 16-byte descriptor.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        match *self {
            Sgl::InCapsule { offset, len } => {
                put_u64(&mut b, 0, offset);
                put_u32(&mut b, 8, len);
                b[15] = TYPE_DATA_BLOCK << 4 | SUBTYPE_OFFSET;
            }
            Sgl::Transport { len } => {
                put_u32(&mut b, 8, len);
                b[15] = TYPE_TRANSPORT << 4 | SUBTYPE_TRANSPORT_SPECIFIC;
            }
            Sgl::Keyed {
                addr,
                len,
                key,
                invalidate,
            } => {
                put_u64(&mut b, 0, addr);
                b[8..11].copy_from_slice(&len.to_le_bytes()[..3]);
                put_u32(&mut b, 11, key);
                let sub = if invalidate {
                    SUBTYPE_INVALIDATE_KEY
                } else {
                    SUBTYPE_ADDRESS
                };
                b[15] = TYPE_KEYED << 4 | sub;
            }
            Sgl::Null => b[15] = TYPE_DATA_BLOCK << 4 | SUBTYPE_ADDRESS,
            Sgl::Unsupported(id) => b[15] = id,
        }
        b
    }

    /// Length of the data the descriptor describes.
    pub fn len(&self) -> u32 {
        match *self {
            Sgl::InCapsule { len, .. } | Sgl::Transport { len } | Sgl::Keyed { len, .. } => len,
            Sgl::Null | Sgl::Unsupported(_) => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rejects descriptor kinds this implementation does not handle.
    pub fn check(&self) -> Result<(), SglError> {
        match *self {
            Sgl::Unsupported(id) => Err(SglError::UnsupportedType(id)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_sgl_matches_linux_host_bytes() {
        // What the Linux NVMe/TCP host puts in DPTR for a 4 KiB read.
        let mut raw = [0u8; 16];
        raw[8..12].copy_from_slice(&4096u32.to_le_bytes());
        raw[15] = 0x5a;
        assert_eq!(Sgl::from_bytes(&raw), Sgl::Transport { len: 4096 });
        assert_eq!(Sgl::Transport { len: 4096 }.to_bytes(), raw);
    }

    #[test]
    fn keyed_sgl_has_24_bit_length_and_key_at_11() {
        let s = Sgl::Keyed {
            addr: 0x1122_3344_5566_7788,
            len: 0x00ab_cdef,
            key: 0xdead_beef,
            invalidate: true,
        };
        let b = s.to_bytes();
        assert_eq!(&b[8..11], &[0xef, 0xcd, 0xab]);
        assert_eq!(get_u32(&b, 11), 0xdead_beef);
        assert_eq!(b[15], 0x4f);
        assert_eq!(Sgl::from_bytes(&b), s);
    }

    #[test]
    fn in_capsule_offset_sgl() {
        let s = Sgl::InCapsule {
            offset: 0,
            len: 1024,
        };
        let b = s.to_bytes();
        assert_eq!(b[15], 0x01);
        assert_eq!(Sgl::from_bytes(&b), s);
        assert!(Sgl::from_bytes(&[0xff; 16]).check().is_err());
    }
}
