//! The 64-byte submission queue entry and the 16-byte completion queue entry.

use super::{sgl::Sgl, Status};
use crate::bytes::{get_u16, get_u32, get_u64, put_u16, put_u32};

/// Size of a submission queue entry (command).
pub const SQE_LEN: usize = 64;
/// Size of a completion queue entry (response).
pub const CQE_LEN: usize = 16;

/// PSDT of every NVMe over Fabrics command: SGLs for data, the metadata
/// pointer is the address of one contiguous buffer (NVMe over Fabrics 1.1,
/// 2.1 "Capsules and Data Transfer").
pub const PSDT_SGL: u8 = 0b01;

/// A submission queue entry: a 64-byte NVMe command, kept in wire form.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; SQE_LEN])
    }
}

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Sqe {{ opc: {:#04x}, cid: {}, nsid: {}, cdw10: {:#x}, cdw11: {:#x}, cdw12: {:#x} }}",
            self.opcode(),
            self.cid(),
            self.nsid(),
            self.cdw(10),
            self.cdw(11),
            self.cdw(12)
        )
    }
}

impl Sqe {
    /// Copies a command out of the first 64 bytes of `b`.
    pub fn from_bytes(b: &[u8]) -> Self {
        let mut s = [0; SQE_LEN];
        s.copy_from_slice(&b[..SQE_LEN]);
        Sqe(s)
    }

    /// A command with opcode and command identifier set, all else zero.
    pub fn new(opcode: u8, cid: u16) -> Self {
        let mut s = Sqe::default();
        s.0[0] = opcode;
        s.set_cid(cid);
        s
    }

    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// FUSE and PSDT bits (byte 1).
    pub fn flags(&self) -> u8 {
        self.0[1]
    }

    /// Fused operation (CDW0 bits 9:8): 0 for a command that is not fused.
    pub fn fuse(&self) -> u8 {
        self.0[1] & 3
    }

    /// PRP or SGL for Data Transfer (CDW0 bits 15:14).
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }

    pub fn set_flags(&mut self, f: u8) {
        self.0[1] = f;
    }

    pub fn cid(&self) -> u16 {
        get_u16(&self.0, 2)
    }

    pub fn set_cid(&mut self, cid: u16) {
        put_u16(&mut self.0, 2, cid);
    }

    pub fn nsid(&self) -> u32 {
        get_u32(&self.0, 4)
    }

    pub fn set_nsid(&mut self, nsid: u32) {
        put_u32(&mut self.0, 4, nsid);
    }

    /// Fabrics command type (byte 4 of a Fabrics command).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// Command dword `n` (0..16).
    pub fn cdw(&self, n: usize) -> u32 {
        get_u32(&self.0, n * 4)
    }

    pub fn set_cdw(&mut self, n: usize, v: u32) {
        put_u32(&mut self.0, n * 4, v);
    }

    /// Dwords 10 and 11 as one 64-bit value (the starting LBA of I/O commands).
    pub fn cdw10_11(&self) -> u64 {
        get_u64(&self.0, 40)
    }

    /// The data pointer (bytes 24..40) as an SGL descriptor.
    pub fn sgl(&self) -> Sgl {
        Sgl::from_bytes(&self.0[24..40])
    }

    pub fn set_sgl(&mut self, sgl: &Sgl) {
        self.0[24..40].copy_from_slice(&sgl.to_bytes());
        self.0[1] = (self.0[1] & 0x3f) | PSDT_SGL << 6;
    }
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// Command-specific dword 0 (e.g. the cntlid of a Connect response).
    pub dw0: u32,
    /// Command-specific dword 1.
    pub dw1: u32,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue identifier.
    pub sqid: u16,
    /// Command identifier of the command this completes.
    pub cid: u16,
    /// Status field including the phase bit (bit 0).
    pub status: u16,
}

impl Cqe {
    /// A completion for `cid` with the given status and all else zero.
    pub fn new(cid: u16, status: Status) -> Self {
        Cqe {
            cid,
            status: status.to_field(0),
            ..Default::default()
        }
    }

    /// Parses the first 16 bytes of `b`.
    pub fn from_bytes(b: &[u8]) -> Self {
        Cqe {
            dw0: get_u32(b, 0),
            dw1: get_u32(b, 4),
            sqhd: get_u16(b, 8),
            sqid: get_u16(b, 10),
            cid: get_u16(b, 12),
            status: get_u16(b, 14),
        }
    }

    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut b = [0; CQE_LEN];
        put_u32(&mut b, 0, self.dw0);
        put_u32(&mut b, 4, self.dw1);
        put_u16(&mut b, 8, self.sqhd);
        put_u16(&mut b, 10, self.sqid);
        put_u16(&mut b, 12, self.cid);
        put_u16(&mut b, 14, self.status);
        b
    }

    /// The status without the phase bit.
    pub fn status(&self) -> Status {
        Status::from_field(self.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_fields_sit_at_spec_offsets() {
        let mut s = Sqe::new(0x02, 0xbeef);
        s.set_nsid(7);
        s.set_cdw(10, 0x1122_3344);
        s.set_cdw(11, 0x5566_7788);
        s.set_cdw(12, 31);
        assert_eq!(s.0[0], 0x02);
        assert_eq!(&s.0[2..4], &[0xef, 0xbe]);
        assert_eq!(&s.0[4..8], &[7, 0, 0, 0]);
        assert_eq!(s.cdw10_11(), 0x5566_7788_1122_3344);
        assert_eq!(s.0[48], 31);
    }

    #[test]
    fn cqe_round_trips_and_keeps_layout() {
        let c = Cqe {
            dw0: 1,
            dw1: 2,
            sqhd: 3,
            sqid: 4,
            cid: 5,
            status: Status::INVALID_FIELD.to_field(0),
        };
        let b = c.to_bytes();
        assert_eq!(b[12], 5);
        assert_eq!(get_u16(&b, 14) >> 1 & 0xff, 0x02);
        assert_eq!(Cqe::from_bytes(&b), c);
    }
}
