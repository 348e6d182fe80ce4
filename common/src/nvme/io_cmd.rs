//! Fields of the NVM command set's I/O commands (NVM Command Set 1.0):
//! the LBA range of Read, Write and Write Zeroes, and Dataset Management
//! with its range descriptors.

use super::Sqe;
use crate::bytes::{get_u32, get_u64, put_u32, put_u64};

/// Size of one Dataset Management range descriptor.
pub const DSM_RANGE_LEN: usize = 16;

/// CDW12 bits 15:0 of Read, Write and Write Zeroes: NLB.
const NLB_MASK: u32 = 0xffff;
/// CDW12 bit 25 of Write Zeroes: Deallocate (DEAC).
const DEAC: u32 = 1 << 25;
/// CDW12 bit 30 of Read and Write: Force Unit Access (FUA).
const FUA: u32 = 1 << 30;
/// CDW11 bit 2 of Dataset Management: Attribute – Deallocate (AD).
const AD: u32 = 1 << 2;

/// The fields of a Read, Write or Write Zeroes command (the opcode aside):
/// which blocks, and how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadWriteCmd {
    pub nsid: u32,
    /// Starting LBA (CDW10 and CDW11).
    pub slba: u64,
    /// Number of logical blocks, 0's based (CDW12 bits 15:0).
    pub nlb: u16,
    /// Force Unit Access (CDW12 bit 30; Read and Write).
    pub fua: bool,
    /// Deallocate the blocks while zeroing them (CDW12 bit 25; Write Zeroes).
    pub deallocate: bool,
}

impl ReadWriteCmd {
    /// The fields of `sqe`, a Read, Write or Write Zeroes.
    #[inline]
    pub fn from_sqe(sqe: &Sqe) -> Self {
        let cdw12 = sqe.cdw(12);
        ReadWriteCmd {
            nsid: sqe.nsid(),
            slba: sqe.cdw10_11(),
            nlb: (cdw12 & NLB_MASK) as u16,
            fua: cdw12 & FUA != 0,
            deallocate: cdw12 & DEAC != 0,
        }
    }

    /// Builds the command `opcode` (Read, Write or Write Zeroes) with
    /// command identifier `cid`; the data pointer is left to the transport.
    pub fn to_sqe(&self, opcode: u8, cid: u16) -> Sqe {
        let mut s = Sqe::new(opcode, cid);
        s.set_nsid(self.nsid);
        put_u64(&mut s.0, 40, self.slba);
        let mut cdw12 = self.nlb as u32;
        if self.fua {
            cdw12 |= FUA;
        }
        if self.deallocate {
            cdw12 |= DEAC;
        }
        s.set_cdw(12, cdw12);
        s
    }

    /// Number of logical blocks (NLB + 1).
    #[inline]
    pub fn blocks(&self) -> u64 {
        self.nlb as u64 + 1
    }
}

/// The fields of a Dataset Management command: how many range descriptors
/// its data holds, and what to do with them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsmCmd {
    pub nsid: u32,
    /// Number of ranges, 0's based (CDW10 bits 7:0).
    pub nr: u8,
    /// Attribute – Deallocate (CDW11 bit 2). The other attributes (integral
    /// dataset for read or write) are hints nothing here acts on.
    pub deallocate: bool,
}

impl DsmCmd {
    /// The fields of `sqe`, a Dataset Management.
    #[inline]
    pub fn from_sqe(sqe: &Sqe) -> Self {
        DsmCmd {
            nsid: sqe.nsid(),
            nr: sqe.cdw(10) as u8,
            deallocate: sqe.cdw(11) & AD != 0,
        }
    }

    /// Builds the command with command identifier `cid`; the data pointer
    /// (the ranges) is left to the transport.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(super::nvm::DSM, cid);
        s.set_nsid(self.nsid);
        s.set_cdw(10, self.nr as u32);
        s.set_cdw(11, if self.deallocate { AD } else { 0 });
        s
    }

    /// Number of ranges (NR + 1).
    #[inline]
    pub fn ranges(&self) -> usize {
        self.nr as usize + 1
    }

    /// Bytes of range descriptors the command's data holds.
    #[inline]
    pub fn data_len(&self) -> usize {
        self.ranges() * DSM_RANGE_LEN
    }
}

/// One 16-byte Dataset Management range descriptor. Its context attributes
/// (bytes 3:0) are written as zero and not read: nothing here uses them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsmRange {
    /// Length in logical blocks (not 0's based: a range may be empty).
    pub nlb: u32,
    /// Starting LBA.
    pub slba: u64,
}

impl DsmRange {
    /// Parses a descriptor; `b` must hold at least [`DSM_RANGE_LEN`] bytes.
    #[inline]
    pub fn parse(b: &[u8]) -> Self {
        DsmRange {
            nlb: get_u32(b, 4),
            slba: get_u64(b, 8),
        }
    }

    /// Writes the descriptor into the first [`DSM_RANGE_LEN`] bytes of `b`.
    pub fn encode_into(&self, b: &mut [u8]) {
        b[..4].fill(0);
        put_u32(b, 4, self.nlb);
        put_u64(b, 8, self.slba);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvme::nvm;

    #[test]
    fn read_write_fields_land_where_the_spec_puts_them() {
        let c = ReadWriteCmd {
            nsid: 3,
            slba: 0x1_0000_0002,
            nlb: 7,
            fua: true,
            deallocate: false,
        };
        let s = c.to_sqe(nvm::WRITE, 9);
        assert_eq!((s.opcode(), s.cid(), s.nsid()), (nvm::WRITE, 9, 3));
        assert_eq!((s.cdw(10), s.cdw(11), s.cdw(12)), (2, 1, 7 | 1 << 30));
        assert_eq!(ReadWriteCmd::from_sqe(&s), c);
        assert_eq!(c.blocks(), 8);
        let zeroes = ReadWriteCmd {
            deallocate: true,
            ..ReadWriteCmd::default()
        };
        let s = zeroes.to_sqe(nvm::WRITE_ZEROES, 0);
        assert_eq!(s.cdw(12), 1 << 25);
        assert_eq!(ReadWriteCmd::from_sqe(&s), zeroes);
    }

    #[test]
    fn dsm_fields_land_where_the_spec_puts_them() {
        let c = DsmCmd {
            nsid: 1,
            nr: 255,
            deallocate: true,
        };
        let s = c.to_sqe(4);
        assert_eq!((s.opcode(), s.cid(), s.nsid()), (nvm::DSM, 4, 1));
        assert_eq!((s.cdw(10), s.cdw(11)), (255, 1 << 2));
        assert_eq!(DsmCmd::from_sqe(&s), c);
        assert_eq!((c.ranges(), c.data_len()), (256, 4096));

        let r = DsmRange {
            nlb: 9,
            slba: 0x0102,
        };
        let mut b = [0xffu8; DSM_RANGE_LEN];
        r.encode_into(&mut b);
        assert_eq!(b, [0, 0, 0, 0, 9, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(DsmRange::parse(&b), r);
    }
}
