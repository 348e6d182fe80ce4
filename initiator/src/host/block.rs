//! Block commands of the NVM command set, as the front-ends issue them.

use rdmablk_common::nvme::{nvm, DsmCmd, DsmRange, ReadWriteCmd, Sqe};

pub use rdmablk_common::nvme::DSM_RANGE_LEN;

/// The command `op` (READ, WRITE, WRITE_ZEROES, FLUSH, or DSM with one
/// deallocate range) for `blocks` blocks (at most 65536) at `lba` of
/// namespace `nsid`. `flag` is FUA for WRITE and deallocate for WRITE_ZEROES.
pub fn sqe(op: u8, nsid: u32, lba: u64, blocks: u64, flag: bool) -> Sqe {
    match op {
        nvm::DSM => DsmCmd {
            nsid,
            nr: 0,
            deallocate: true,
        }
        .to_sqe(0),
        nvm::FLUSH => {
            let mut sqe = Sqe::new(op, 0);
            sqe.set_nsid(nsid);
            sqe
        }
        _ => ReadWriteCmd {
            nsid,
            slba: lba,
            nlb: (blocks.max(1) - 1) as u16,
            fua: op == nvm::WRITE && flag,
            deallocate: op == nvm::WRITE_ZEROES && flag,
        }
        .to_sqe(op, 0),
    }
}

/// Writes one Dataset Management range (no attributes) into `out`.
pub fn dsm_range(out: &mut [u8], lba: u64, blocks: u32) {
    DsmRange {
        nlb: blocks,
        slba: lba,
    }
    .encode_into(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_land_where_the_spec_puts_them() {
        let s = sqe(nvm::WRITE, 3, 0x1_0000_0002, 8, true);
        assert_eq!(s.opcode(), nvm::WRITE);
        assert_eq!(s.nsid(), 3);
        assert_eq!(s.cdw(10), 2);
        assert_eq!(s.cdw(11), 1);
        assert_eq!(s.cdw(12), 7 | 1 << 30);
        assert_eq!(sqe(nvm::WRITE_ZEROES, 1, 0, 1, true).cdw(12), 1 << 25);
        assert_eq!(sqe(nvm::DSM, 1, 0, 1, true).cdw(11), 1 << 2);
        let mut r = [0xffu8; 16];
        dsm_range(&mut r, 0x0102, 9);
        assert_eq!(r, [0, 0, 0, 0, 9, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0]);
    }
}
